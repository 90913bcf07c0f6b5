"""A model whose served call can poison a CUDA context: it indexes a table
with indices computed from a floating-point input's values, a range the
capture cannot fence (SECURITY.md). Example calls stay within the table; a
call with large values makes the compiled kernel read far outside it, which
on CUDA fails with a sticky error, so that every later call on the device
fails. tests/device/gpu_check.sh serves it to see the server stop calling
itself live."""

import torch


class ValueIndexed(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("table", torch.arange(64, dtype=torch.float32) * 0.5)

    def forward(self, x):
        return self.table[(x.abs() * 4).long()] + x


def make_model() -> torch.nn.Module:
    return ValueIndexed().eval()
