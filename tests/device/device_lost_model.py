"""A model whose served call can poison a CUDA context: nll_loss with
targets computed from a floating-point input's values. The capture fences
the indices it sees in the exported graph (index_fences.py), but nll_loss's
targets become indices only inside Inductor, which lowers the op to a
gather that checks them with a device-side assert. Example calls stay within
the four classes; a call with large values fails that assert, a sticky
error, so that every later call on the device fails (on the CPU, the check
throws inside an OpenMP region and ends the process). tests/device/
gpu_check.sh serves it to see the server stop calling itself live."""

import torch
import torch.nn.functional as F


class UnseenIndices(torch.nn.Module):
    def forward(self, x):
        target = (x[:, 0].abs() * 0.5).long()
        return F.nll_loss(F.log_softmax(x, dim=1), target, reduction="none")


def make_model() -> torch.nn.Module:
    return UnseenIndices().eval()
