"""Sizes the exported program relates without a guard of torch.export's own.

torch.export gives two inputs' batch dimensions two symbols when nothing it
checks relates them, although the compiled code needs them equal: Hugging
Face's attention masks index the mask's batch with arange of input_ids'
batch size. Served with other sizes, that code read past the mask or threw
inside an OpenMP region, which ends the server. The guards require such
sizes equal; sizes that are really independent stay so.

Exports only (no AOTInductor compile): fast.
"""

import torch
from torch.export import Dim

from precompile_capture.guards import extract_guards

AUTO = Dim.AUTO


def guards_of(module, args, shapes):
    ep = torch.export.export(module, args, dynamic_shapes=shapes, strict=True)
    guards, _ = extract_guards(ep, list(args))
    return guards


class MaskIndexedByBatch(torch.nn.Module):
    """transformers' padding_mask_function: mask[arange(batch)]."""

    def forward(self, ids, mask):
        return mask[torch.arange(ids.shape[0])].sum(-1) + ids.sum(-1)


class OuterProduct(torch.nn.Module):
    def forward(self, a, b):
        return a[:, None] * b[None, :]


class IndexedPastTheBatch(torch.nn.Module):
    """mask[arange(batch) + 1]: the indices need more rows than the batch,
    which equality would not express."""

    def forward(self, ids, mask):
        return mask[torch.arange(ids.shape[0]) + 1].sum(-1) + ids.sum(-1)


def test_a_mask_indexed_by_another_inputs_batch_must_have_that_batch():
    guards = guards_of(MaskIndexedByBatch(), (torch.randn(3, 4), torch.randn(3, 6)),
                       ({0: AUTO, 1: AUTO}, {0: AUTO, 1: AUTO}))
    ids, mask = guards.args
    assert ids.tensor.dims[0].symbol == mask.tensor.dims[0].symbol
    # The sequence lengths are independent and stay so.
    assert ids.tensor.dims[1].symbol != mask.tensor.dims[1].symbol
    assert guards.holds([torch.randn(16, 4), torch.randn(16, 6)])
    assert not guards.holds([torch.randn(16, 4), torch.randn(2, 6)])
    assert not guards.holds([torch.randn(2, 4), torch.randn(16, 6)])
    assert guards.describe(["ids", "mask"]).startswith("ids: float32[s0 in [2, inf), s1")


def test_sizes_that_only_meet_in_an_outer_product_stay_independent():
    guards = guards_of(OuterProduct(), (torch.randn(3), torch.randn(5)), ({0: AUTO}, {0: AUTO}))
    a, b = guards.args
    assert a.tensor.dims[0].symbol != b.tensor.dims[0].symbol
    assert guards.holds([torch.randn(7), torch.randn(2)])


def test_indices_with_an_offset_relate_nothing():
    guards = guards_of(IndexedPastTheBatch(), (torch.randn(3, 4), torch.randn(5, 6)),
                       ({0: AUTO, 1: AUTO}, {0: AUTO, 1: AUTO}))
    ids, mask = guards.args
    assert ids.tensor.dims[0].symbol != mask.tensor.dims[0].symbol


class IndexesWithItsInputs(torch.nn.Module):
    """A table of 10 rows read by gather, index_select, indexing and a
    scatter, each with an integer input of its own (one with an offset)."""

    def __init__(self):
        super().__init__()
        self.table = torch.nn.Parameter(torch.randn(10, 4))

    def forward(self, rows, cols, picked, shifted, hot):
        gathered = self.table.gather(0, rows)
        selected = self.table.index_select(0, picked)
        indexed = self.table[shifted + 2]
        scattered = torch.zeros(10, 4).scatter_add(0, hot, torch.ones_like(hot, dtype=torch.float))
        return gathered.sum() + selected.sum() + indexed.sum() + scattered.sum() + cols.sum()


def test_integer_inputs_that_index_a_table_get_the_tables_range():
    ints = lambda *shape: torch.zeros(*shape, dtype=torch.int64)  # noqa: E731
    args = (ints(3, 4), torch.randn(5), ints(3), ints(2), ints(3, 4))
    guards = guards_of(IndexesWithItsInputs(), args, None)
    ranges = {i: (lo, hi) for i, lo, hi in guards.index_ranges}
    # gather, index_select, scatter: [0, rows); indexing counts from the end
    # too, less the constant added.
    assert ranges == {0: (0, 10), 2: (0, 10), 3: (-12, 8), 4: (0, 10)}, ranges
    assert guards.holds(list(args))


class MaskPaddedToEight(torch.nn.Module):
    """A mask indexed by arange of the input's length (the guards require the
    two lengths equal), and a condition on that length the solver cannot
    prove over a whole range: the guard scaled_dot_product_attention adds on
    CUDA, where it pads a mask to a multiple of 8. GPT-2 and Llama prefill
    calls failed to capture for CUDA so."""

    def forward(self, x, mask):
        s = x.shape[1]
        if s * (8 + s - s % 8) > 1:
            return x * mask[:, torch.arange(s)]
        return x


def test_sizes_the_program_will_not_make_one_stay_apart_but_guarded_equal():
    import contextlib
    import tempfile

    from precompile_capture.compiling import VariantCompiler
    from precompile_capture.frames import Frame

    frame = Frame("forward", is_entry=True, module=MaskPaddedToEight())
    with tempfile.TemporaryDirectory() as workdir:
        compiler = VariantCompiler(workdir, None, contextlib.nullcontext)
        compiler._trace(frame, [torch.randn(1, 7), torch.randn(1, 7)])
        # The second length makes it dynamic: exporting the two lengths as one
        # size violates that guard, so they are exported apart.
        _, guards, _ = compiler._trace(frame, [torch.randn(1, 9), torch.randn(1, 9)])
    assert guards.holds([torch.randn(1, 30), torch.randn(1, 30)])
    assert not guards.holds([torch.randn(1, 30), torch.randn(1, 12)])
    # Not the padding's own shape guard (x.size(1)*(8 + x.size(1) - x.size(1) % 8) > 1),
    # which every size the range takes keeps.
    assert guards.describe(["x", "mask"]) == "x: float32[1, s0 in [2, inf)], mask: float32[1, s0]"


class CacheUpdatedInPlace(torch.nn.Module):
    """transformers' StaticCache.update, k_out.index_copy_(2, cache_position,
    key_states): the positions are the client's, one per new slice."""

    def forward(self, x, cache_position):
        buf = torch.zeros(x.shape[0], 16, x.shape[2], dtype=x.dtype)
        buf.index_copy_(1, cache_position, x)
        return buf.sum(1)


def test_a_copy_in_place_takes_one_index_per_slice_of_its_source_each_within_the_table():
    # Five positions for three slices: the compiled copy read two slices
    # past the source, and served what other memory held.
    guards = guards_of(CacheUpdatedInPlace(), (torch.randn(2, 3, 4), torch.tensor([5, 6, 7])),
                       ({0: AUTO, 1: AUTO, 2: AUTO}, {0: AUTO}))
    x, positions = guards.args
    assert x.tensor.dims[1].symbol == positions.tensor.dims[0].symbol
    assert guards.index_ranges == ((1, 0, 16),)
    assert guards.holds([torch.randn(2, 5, 4), torch.arange(5)])
    assert not guards.holds([torch.randn(2, 3, 4), torch.arange(5)])
    assert not guards.holds([torch.randn(2, 3, 4), torch.arange(2)])


class RowsPutInPlace(torch.nn.Module):
    """buf[positions] = rows: one row of values per index."""

    def forward(self, rows, positions):
        buf = torch.zeros(8, rows.shape[1])
        buf[positions] = rows
        return buf


def test_values_put_in_place_are_as_many_as_the_indices_select():
    guards = guards_of(RowsPutInPlace(), (torch.randn(3, 4), torch.tensor([1, 4, 6])),
                       ({0: AUTO, 1: AUTO}, {0: AUTO}))
    rows, positions = guards.args
    assert rows.tensor.dims[0].symbol == positions.tensor.dims[0].symbol
    assert guards.index_ranges == ((1, -8, 8),)
    assert not guards.holds([torch.randn(2, 4), torch.tensor([1, 4, 6])])
