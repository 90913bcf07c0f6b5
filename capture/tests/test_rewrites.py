"""Ops whose compiled form would not serve what eager computes, rewritten
by the capture before it compiles (rewrites.py).

A bilinear grid sampler with reflection padding, compiled by Inductor for
the CPU with a dynamic batch: a grid of 35 points (a vector and its tail)
holding a value just past an odd integer (255.00001525878906) or of about
1e7 made its kernel check an image index out of bounds, which AOTInductor's
runner turns into the end of the serving process. The capture rewrites the
sampler (`reflect_grids_before_sampling`); here the rewritten graph is
compiled by Inductor (torch.compile raises the same check as an exception)
and called with those grids: one compile, about 20 s on two cores.

An embedding with max_norm renormalizes its table in place; AOTInductor
returned the table as an extra output, and every call of such a variant
failed in the server. The capture scales the looked-up rows instead: the
served program writes nothing and answers as eager does (export only).
"""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch.export import Dim

from precompile_capture.guards import GuardExtractionError, extract_guards


class Warp(torch.nn.Module):
    def __init__(self, align_corners):
        super().__init__()
        self.align_corners = align_corners
        self.register_buffer("image", torch.randn(1, 1, 5, 5, generator=torch.Generator().manual_seed(0)))

    def forward(self, grid):
        image = self.image.expand(grid.shape[0], 1, 5, 5)
        return F.grid_sample(image, grid, mode="bilinear", padding_mode="reflection",
                             align_corners=self.align_corners)


def captured(module, grid):
    ep = torch.export.export(module, (grid,), dynamic_shapes=({0: Dim.AUTO},), strict=True)
    extract_guards(ep, [grid])
    return ep.module()


def test_grids_past_the_image_sample_as_eager_reflects_them_in_compiled_code():
    grid = torch.rand(2, 5, 7, 2, generator=torch.Generator().manual_seed(1)) * 2 - 1
    warp = Warp(align_corners=False).eval()
    compiled = torch.compile(captured(warp, grid), dynamic=True)
    assert torch.allclose(compiled(grid), warp(grid), atol=1e-5)
    for value in (255.00001525878906, -255.00001525878906, 9.49e6, 1e8):
        hostile = grid.clone()
        hostile.view(-1)[:] = value
        # Eager itself loses precision folding 1e8 into 5 pixels.
        if abs(value) < 1e6:
            assert torch.allclose(compiled(hostile), warp(hostile), atol=1e-3), value
        else:
            assert compiled(hostile).isfinite().all(), value
    # Past the image, within a few spans: eager's reflection, to rounding.
    beyond = grid * 7.5
    assert torch.allclose(compiled(beyond), warp(beyond), atol=1e-4)


def test_only_reflection_is_rewritten_and_it_samples_as_eager_does():
    grid = torch.rand(2, 5, 7, 2, generator=torch.Generator().manual_seed(2)) * 2 - 1
    for align_corners in (False, True):
        warp = Warp(align_corners).eval()
        module = captured(warp, grid)
        samplers = [n for n in module.graph.nodes if n.target == torch.ops.aten.grid_sampler.default]
        assert [n.args[3] for n in samplers] == [1]
        for scale in (1.0, 3.7, 40.0):
            assert torch.allclose(module(grid * scale), warp(grid * scale), atol=1e-4), (align_corners, scale)

    class Zeros(Warp):
        def forward(self, grid):
            return F.grid_sample(self.image.expand(grid.shape[0], 1, 5, 5), grid, padding_mode="zeros",
                                 align_corners=False)

    module = captured(Zeros(False).eval(), grid)
    assert [n.args[3] for n in module.graph.nodes if n.target == torch.ops.aten.grid_sampler.default] == [0]


class Words(torch.nn.Module):
    def __init__(self, tied=False):
        super().__init__()
        torch.manual_seed(0)
        self.embedding = torch.nn.Embedding(10, 4, max_norm=1.0)
        self.tied = tied

    def forward(self, ids):
        words = self.embedding(ids)
        return words @ self.embedding.weight.t() if self.tied else words * 2


def test_rows_past_max_norm_are_scaled_as_eager_scales_them_and_the_table_is_not_written():
    words = Words().eval()
    assert (words.embedding.weight.norm(dim=1) > 1).sum() >= 8
    ids = torch.tensor([[1, 2, 3, 3]])
    ep = torch.export.export(copy.deepcopy(words), (ids,), dynamic_shapes=({1: Dim.AUTO},), strict=True)
    guards, _ = extract_guards(ep, [ids])
    assert guards.index_ranges == ((0, 0, 10),)
    served = ep.module()
    table = served.embedding.weight.detach().clone()
    used = copy.deepcopy(words)
    for call in ([[1, 2, 3, 3]], [[0, 1, 2, 4, 5, 6, 7, 8, 9]], [[3, 6, 3]]):
        x = torch.tensor(call)
        # Eager from the captured weights, and eager after its earlier calls
        # scaled rows in place: the same answer.
        expected = copy.deepcopy(words)(x)
        assert torch.allclose(served(x), expected, rtol=0, atol=1e-6), call
        assert torch.allclose(used(x), expected, rtol=0, atol=1e-6), call
    assert torch.equal(served.embedding.weight, table)


def test_a_renormed_table_used_otherwise_afterwards_is_refused_naming_it():
    ids = torch.tensor([[1, 2, 3]])
    ep = torch.export.export(Words(tied=True).eval(), (ids,), strict=True)
    with pytest.raises(GuardExtractionError, match="max_norm renormalizes its table 'p_embedding_weight' in place, "
                                                   "and the graph then uses the table otherwise"):
        extract_guards(ep, [ids])


class TwoLookups(Words):
    """One table with max_norm looked up twice, then without it."""

    def __init__(self, plain=False):
        super().__init__()
        self.plain = plain

    def forward(self, a, b):
        both = self.embedding(a) + self.embedding(b)
        return both + F.embedding(a.flip(0), self.embedding.weight) if self.plain else both


def test_a_table_looked_up_twice_with_max_norm_is_served_as_eager():
    a, b = torch.tensor([1, 2, 3]), torch.tensor([3, 4, 5])
    ep = torch.export.export(copy.deepcopy(TwoLookups()), (a, b), strict=True)
    extract_guards(ep, [a, b])
    assert torch.allclose(ep.module()(a, b), TwoLookups()(a, b), rtol=0, atol=1e-6)
    # A plain lookup after the renorms sees the rows they scaled in eager.
    ep = torch.export.export(TwoLookups(plain=True), (a, b), strict=True)
    with pytest.raises(GuardExtractionError, match=r"uses the table otherwise \(aten.embedding.default\)"):
        extract_guards(ep, [a, b])
