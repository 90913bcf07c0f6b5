"""A model whose served call can poison a CUDA context: it asserts its
input's values with torch._assert_async, which Inductor compiles into a
device-side assert. Example calls stay within the bound; a call with large
values fails the assert, a sticky error, so that every later call on the
device fails (on the CPU the same check fails only that call). The capture
fences the indices it can see (index_fences.py), so no indexing model
poisons the device any more; an assert stands for the faults that remain
(a kernel's own bug, an op the capture does not know). tests/device/
gpu_check.sh serves it to see the server stop calling itself live."""

import torch


class AssertsItsValues(torch.nn.Module):
    def forward(self, x):
        torch._assert_async((x.abs() < 100).all(), "|x| below 100")
        return torch.log_softmax(x, dim=1)


def make_model() -> torch.nn.Module:
    return AssertsItsValues().eval()
