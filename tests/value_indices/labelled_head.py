"""A language model's head served with its labels, as transformers' models
compute their loss when called with `labels=`: logits over 1000 classes and
the mean cross entropy of the positions whose label is not -100. The labels
become indices into the classes only inside Inductor's lowering of the loss,
so the capture fences them (index_fences.py: a class, or the ignore_index);
unfenced, one request with a label past the classes ended the process on
the CPU and poisons the device on CUDA (tests/hostile)."""

import torch
import torch.nn.functional as F

CLASSES = 1000


class LabelledHead(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.head = torch.nn.Linear(32, CLASSES)

    def forward(self, hidden, labels):
        logits = self.head(hidden)
        loss = F.cross_entropy(logits.view(-1, CLASSES), labels.view(-1), ignore_index=-100)
        return logits, loss


def make_labelled_head() -> LabelledHead:
    return LabelledHead().eval()
