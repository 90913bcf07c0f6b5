"""A speech model's CTC head, called as speech recognisers are: without
labels it returns log-probabilities; with `labels=` it returns their loss,
each row's target being its labels that are not negative (padding). The first
kind compiles. Selecting the labels has a size that depends on their values,
so Dynamo cannot compile the second: the server runs it with the frame's
eager program, in which ATen's ctc_loss reads the log-probabilities at each
label without a bound check of its own. Unchecked, one label of 1e8 ended the
process and a label equal to the class count read another allocation
(runtime/kernel_input_checks.cc; tests/hostile)."""

from typing import Optional

import torch
import torch.nn.functional as F

CLASSES = 12


class CtcHead(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.head = torch.nn.Linear(16, CLASSES)

    def forward(self, hidden: torch.Tensor, labels: Optional[torch.Tensor] = None):
        log_probs = self.head(hidden).log_softmax(-1).transpose(0, 1)
        if labels is None:
            return log_probs
        kept = labels >= 0
        targets = labels.masked_select(kept)
        input_lengths = torch.full((hidden.size(0),), hidden.size(1), dtype=torch.long)
        return F.ctc_loss(log_probs, targets, input_lengths, kept.sum(-1), reduction="sum")


def make_ctc_head() -> CtcHead:
    return CtcHead().eval()
