"""Benchmark models, captured at build time by bench/BUILD.bazel.

- medium: an MLP 256 -> 1024 -> 1024 -> 256 (ReLU between), served at batch
  32: about 1.3 M parameters (5.3 MB of float32 weights) and 33 MFLOP per call
  (x2 for multiply-add), against the bundled `mlp` example's 4 -> 8 -> 3.

Seeded like examples/models.py, so every process builds the same weights:
the Python peer (python_kserve_server.py) and the captured artifact compute
the same function.
"""

import torch


class MediumMLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(256, 1024),
            torch.nn.ReLU(),
            torch.nn.Linear(1024, 1024),
            torch.nn.ReLU(),
            torch.nn.Linear(1024, 256),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def make_medium() -> MediumMLP:
    torch.manual_seed(0)
    return MediumMLP().eval()
