"""A model whose outputs' sizes are expressions of its input's batch: a
concatenation (2 * batch rows) and a flattening (4 * batch values). The
server must know those sizes before the model runs, to refuse a call whose
outputs no response could carry (tests/hostile)."""

import torch


class Tiles(torch.nn.Module):
    def forward(self, x: torch.Tensor):
        return torch.cat([x, x * 2]), x.reshape(-1)


def make_tiles() -> Tiles:
    return Tiles().eval()
