"""A model that indexes a table with indices computed from a floating-point
input's values: a range the capture cannot bound, so its graph is fenced
(capture/precompile_capture/index_fences.py) and the compiled code checks
the indices before the table is read. A call whose values take them past
the table fails, and the server serves on (tests/hostile); unfenced, the
same call ended the process on the CPU and poisoned the device on CUDA."""

import torch


class ValueIndexed(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("table", torch.arange(64, dtype=torch.float32) * 0.5)

    def forward(self, x):
        return self.table[(x.abs() * 4).long()] + x


def make_value_indexed() -> ValueIndexed:
    return ValueIndexed().eval()
