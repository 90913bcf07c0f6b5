"""A model whose answer depends on a product of its input's sizes: tiles
of at most 64 elements are doubled, larger ones negated. torch.export keeps
the branch's guard (x.size(0)*x.size(1) <= 64, or > 64) only as code, which
AOTInductor's package never runs: before the capture made it a guard of the
variant, the server answered a large tile with the small side's code
(tests/hostile)."""

import torch

AREA = 64


class AreaBranch(torch.nn.Module):
    def forward(self, tile):
        if tile.shape[0] * tile.shape[1] > AREA:
            return -tile
        return tile * 2


def make_area_branch() -> AreaBranch:
    return AreaBranch().eval()
