"""Indices the exported graph computes, fenced where their range follows
from the sizes.

Compiled code that indexes past a table ends the server (AOTInductor's CPU
bounds check throws inside an OpenMP region). RoBERTa's position ids are not
an arange but a count of the tokens that are not padding, plus the pad
index: served a sequence two shorter than its position table or longer,
RoBERTa ended the process. The capture bounds such sizes; indices it cannot
bound are warned of, and checked as the compiled code runs (the graph it
compiles is fenced: run here eagerly).

Exports only (no AOTInductor compile): fast.
"""

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch.export import Dim

from precompile_capture.guards import extract_guards

AUTO = Dim.AUTO
PAD = 1


def guards_and_warnings(module, args, shapes, kwargs=None):
    ep = torch.export.export(module, args, kwargs, dynamic_shapes=shapes, strict=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        guards, _ = extract_guards(ep, list(args) + list((kwargs or {}).values()))
    return guards, [str(w.message) for w in caught if "precompile capture" in str(w.message)]


def symbol_of(guards, parameter, dim):
    return {s.symbol: s for s in guards.symbols}[guards.args[parameter].tensor.dims[dim].symbol]


class CountedPositions(torch.nn.Module):
    """transformers' create_position_ids_from_input_ids (RoBERTa, XLM-R):
    positions count the tokens that are not padding, from PAD + 1."""

    def __init__(self, rows):
        super().__init__()
        self.positions = torch.nn.Embedding(rows, 4, padding_idx=PAD)

    def forward(self, ids):
        mask = ids.ne(PAD).int()
        incremental = (torch.cumsum(mask, dim=1).type_as(mask) + 0) * mask
        return self.positions(incremental.long() + PAD)


def ids(batch, sequence):
    return torch.randint(2, 100, (batch, sequence))


def test_positions_counted_from_the_pad_index_bound_the_sequence_by_the_table():
    guards, warned = guards_and_warnings(CountedPositions(66), (ids(3, 16),), ({0: AUTO, 1: AUTO},))
    # At most 64 tokens: positions 2..65 of a table of 66 rows.
    assert symbol_of(guards, 0, 1).max == 64
    assert symbol_of(guards, 0, 0).max is None
    assert warned == []
    assert guards.holds([ids(3, 64)])
    assert not guards.holds([ids(3, 65)])


def test_roberta_is_bounded_by_its_position_table():
    from transformers import RobertaConfig, RobertaModel

    torch.manual_seed(0)
    config = RobertaConfig(vocab_size=100, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                           intermediate_size=32, max_position_embeddings=40, pad_token_id=PAD)
    model = RobertaModel(config).eval()
    both = {0: AUTO, 1: AUTO}
    guards, _ = guards_and_warnings(
        model, (), {"input_ids": both, "attention_mask": both},
        kwargs={"input_ids": ids(3, 16), "attention_mask": torch.ones(3, 16, dtype=torch.int64)})
    # Positions from PAD + 1 = 2 to 39, the table's last row: 38 tokens.
    assert symbol_of(guards, 0, 1).max == 38, guards.symbols


class Clamped(torch.nn.Module):
    """DeBERTa's relative positions: clamped into the table before a gather."""

    def forward(self, x, table):
        relative = torch.arange(x.shape[1])[:, None] - torch.arange(x.shape[1])[None, :]
        index = torch.clamp(relative + 8, 0, 15)
        return table.gather(0, index.expand(x.shape[0], -1, -1).flatten(0, 1)[:, :1].expand(-1, 4))


def test_clamped_indices_need_no_bound_and_no_warning():
    guards, warned = guards_and_warnings(Clamped(), (torch.randn(2, 12), torch.randn(16, 4)),
                                         ({0: AUTO, 1: AUTO}, None))
    assert all(s.max is None for s in guards.symbols)
    assert warned == []


class PickedByArgmax(torch.nn.Module):
    """CLIP's pooling: each row's vector at its argmax, a dimension of
    dynamic size indexed by values within it."""

    def __init__(self):
        super().__init__()
        self.table = torch.nn.Embedding(100, 4)

    def forward(self, ids):
        hidden = self.table(ids)
        return hidden[torch.arange(hidden.shape[0]), ids.argmax(-1)]


def test_indices_within_the_dimension_they_index_need_no_bound():
    guards, warned = guards_and_warnings(PickedByArgmax(), (ids(3, 9),), ({0: AUTO, 1: AUTO},))
    assert all(s.max is None for s in guards.symbols)
    assert warned == []


class PickedFromAnother(torch.nn.Module):
    """The argmax of one input's rows picks from another's, whose length
    nothing relates to the first's."""

    def forward(self, ids, hidden):
        return hidden[torch.arange(hidden.shape[0]), ids.argmax(-1)]


def test_indices_into_a_dimension_of_another_size_are_warned_of():
    _, warned = guards_and_warnings(PickedFromAnother(), (ids(3, 9), torch.randn(3, 9, 4)),
                                    ({0: AUTO, 1: AUTO}, {0: AUTO, 1: AUTO}))
    assert len(warned) == 1 and "aten.index.Tensor's indices from ids into dimension 1 (s" in warned[0]


class BufferIndexed(torch.nn.Module):
    """Swin's relative position index: a buffer whose values index a table."""

    def __init__(self, top):
        super().__init__()
        self.register_buffer("index", torch.tensor([[0, top], [3, 1]]))
        self.table = torch.nn.Parameter(torch.randn(8, 4))

    def forward(self, x):
        return self.table[self.index].sum() + x


def test_a_buffer_of_indices_is_read_for_its_values():
    _, warned = guards_and_warnings(BufferIndexed(7), (torch.randn(3),), None)
    assert warned == []


class CountedFromTheMask(torch.nn.Module):
    """transformers' OPT: positions count the mask's ones (cumsum), less one,
    plus an offset of 2, into a table of 130 rows."""

    def __init__(self):
        super().__init__()
        self.positions = torch.nn.Embedding(130, 4)

    def forward(self, ids, mask):
        positions = (torch.cumsum(mask, dim=1).type_as(mask) * mask).long() - 1
        return self.positions(positions + 2) + ids.unsqueeze(-1)


def test_indices_counted_from_a_mask_fence_the_mask_to_0_and_1_and_bound_the_sequence():
    ids, mask = torch.ones(3, 16), torch.ones(3, 16, dtype=torch.int64)
    guards, warned = guards_and_warnings(CountedFromTheMask(), (ids, mask),
                                         ({0: AUTO, 1: AUTO}, {0: AUTO, 1: AUTO}))
    assert warned == []
    # The mask's values, checked by the server: a mask of 5s would count
    # past the table.
    assert guards.index_ranges == ((1, 0, 2),)
    # At most 128 tokens: positions 1..129.
    assert symbol_of(guards, 1, 1).max == 128


def test_opt_fences_its_mask_and_is_bounded_by_its_position_table():
    from transformers import OPTConfig, OPTForCausalLM

    torch.manual_seed(0)
    config = OPTConfig(vocab_size=100, hidden_size=16, num_hidden_layers=1, ffn_dim=32,
                       num_attention_heads=2, max_position_embeddings=40, word_embed_proj_dim=16,
                       use_cache=False, pad_token_id=PAD)
    model = OPTForCausalLM(config).eval()
    both = {0: AUTO, 1: AUTO}
    guards, warned = guards_and_warnings(
        model, (), {"input_ids": both, "attention_mask": both},
        kwargs={"input_ids": ids(3, 16), "attention_mask": torch.ones(3, 16, dtype=torch.int64)})
    assert warned == []
    ranges = {i: (lo, hi) for i, lo, hi in guards.index_ranges}
    assert ranges[1] == (0, 2), ranges
    # Its 40 positions are rows 2..41 of a table of 42.
    assert symbol_of(guards, 0, 1).max == 40, guards.symbols


class CountsWhatIsNeverThere(torch.nn.Module):
    """Counts ids above 100 into a table of 20: the range says up to the
    sequence's length, but the example call has none, and 30 tokens."""

    def __init__(self):
        super().__init__()
        self.table = torch.nn.Embedding(20, 4)

    def forward(self, ids):
        return self.table(torch.cumsum((ids > 100).long(), dim=1))


def test_a_bound_that_would_refuse_the_example_call_itself_is_not_imposed():
    example = torch.randint(0, 100, (2, 30))
    guards, warned = guards_and_warnings(CountsWhatIsNeverThere(), (example,), ({0: AUTO, 1: AUTO},))
    assert guards.holds([example])
    assert all(s.max is None for s in guards.symbols)
    assert len(warned) == 1 and "aten.embedding.default's indices from ids into dimension 0 (20) of table.weight" in warned[0]


class Doubled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.table = torch.nn.Embedding(10, 4)

    def forward(self, ids):
        return self.table(ids * 2)


def test_indices_computed_otherwise_take_the_values_the_calls_showed():
    guards, warned = guards_and_warnings(Doubled(), (torch.tensor([2, 4]),), None)
    assert warned == []
    assert guards.index_ranges == ((0, 2, 5),)


class Scaled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.table = torch.nn.Embedding(10, 4)

    def forward(self, x):
        return self.table((x * 3).long())


def fenced(module, args, shapes):
    """`module` exported, and its graph as the capture leaves it, run eagerly."""
    ep = torch.export.export(module, args, dynamic_shapes=shapes, strict=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        extract_guards(ep, list(args))
    return ep.module(), [str(w.message) for w in caught if "precompile capture" in str(w.message)]


FENCE_FAILED = "into dimension"


def test_indices_computed_from_a_float_input_are_checked_before_they_are_read():
    guards, warned = guards_and_warnings(Scaled(), (torch.tensor([1.0, 2.0]),), None)
    assert guards.index_ranges == ()
    assert len(warned) == 1
    assert "aten.embedding.default's indices from x into dimension 0 (10) of table.weight" in warned[0]
    assert "checks them before the op reads them" in warned[0]

    model = Scaled()
    program, _ = fenced(model, (torch.tensor([1.0, 2.0]),), ({0: AUTO},))
    within = torch.tensor([0.0, 1.2, 3.1, 0.4])
    assert torch.equal(program(within), model(within))
    # 3 * 3.4 = 10 is past the table's 10 rows; -1 before it: eagerly, an
    # IndexError from the embedding itself, where the fence fails first.
    for outside in (3.4, -0.5):
        with pytest.raises(RuntimeError,
                           match=r"aten.embedding.default's indices from x into dimension 0 \(10\) of table.weight"):
            program(torch.tensor([1.0, outside]))


def test_indices_into_a_dimension_of_another_size_are_checked_against_its_size():
    model = PickedFromAnother()
    program, warned = fenced(model, (ids(3, 9), torch.randn(3, 9, 4)),
                             ({0: AUTO, 1: AUTO}, {0: AUTO, 1: AUTO}))
    assert len(warned) == 1 and "checks them before the op reads them" in warned[0]
    picks = torch.zeros(2, 12, dtype=torch.int64)
    picks[0, 3] = picks[1, 5] = 1
    hidden = torch.randn(2, 7, 4)
    assert torch.equal(program(picks, hidden), model(picks, hidden))
    picks[1, 5], picks[1, 10] = 0, 1  # column 10 of a dimension of 7
    with pytest.raises(RuntimeError, match=FENCE_FAILED):
        program(picks, hidden)


@pytest.mark.parametrize("offset, largest", [(0, 11), (3, 9)])
def test_positions_scaled_and_shifted_bound_the_size(offset, largest):
    class Scaled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.table = torch.nn.Embedding(21, 4)

        def forward(self, x):
            # Positions 0, 2, ..., 2 * (n - 1), then `offset` added: the
            # largest, 2n - 2 + offset, must stay below 21.
            return self.table(torch.arange(x.shape[0]) * 2 + offset)

    guards, warned = guards_and_warnings(Scaled(), (torch.randn(5),), ({0: AUTO},))
    assert symbol_of(guards, 0, 0).max == largest
    assert warned == []


class LabelledHead(torch.nn.Module):
    """A language model's head called with labels, as transformers' models
    compute their loss: the labels are class indices into the logits' last
    dimension only inside cross_entropy (Inductor lowers it to a gather),
    and -100 marks a position the loss skips."""

    def __init__(self, classes):
        super().__init__()
        self.head = torch.nn.Linear(4, classes)

    def forward(self, hidden, labels):
        logits = self.head(hidden)
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="none")


def test_loss_targets_are_checked_as_classes_or_the_ignore_index():
    model = LabelledHead(10)
    hidden, labels = torch.randn(2, 3, 4), torch.tensor([[1, 9, -100], [0, 4, 5]])
    program, warned = fenced(model, (hidden, labels), ({0: AUTO, 1: AUTO}, {0: AUTO, 1: AUTO}))
    assert len(warned) == 1
    assert ("aten.cross_entropy_loss.default's class targets from labels: indices into dimension 1 (10) "
            "of its input, or -100 (its ignore_index)") in warned[0]
    assert "checks them before the op reads them" in warned[0]
    assert torch.equal(program(hidden, labels), model(hidden, labels))
    for outside in (10, -1, -99, 2**40):
        bad = labels.clone()
        bad[1, 2] = outside
        with pytest.raises(RuntimeError, match=r"aten.cross_entropy_loss.default's class targets from labels: indices into "
                           r"dimension 1 \(10\) of its input, or -100 \(its ignore_index\)"):
            program(hidden, bad)


def test_a_loss_s_own_ignore_index_is_taken_and_no_other():
    class Scored(torch.nn.Module):
        def forward(self, scores, labels):
            return F.nll_loss(scores.log_softmax(-1), labels, ignore_index=7, reduction="none")

    model = Scored()
    scores, labels = torch.randn(4, 5), torch.tensor([0, 4, 7, 2])
    program, warned = fenced(model, (scores, labels), ({0: AUTO}, {0: AUTO}))
    assert len(warned) == 1 and "aten.nll_loss_nd.default" in warned[0]
    assert torch.equal(program(scores, labels), model(scores, labels))
    with pytest.raises(RuntimeError, match=r"class targets from labels: .*, or 7 \(its ignore_index\)"):
        program(scores, torch.tensor([0, 4, -100, 2]))


def test_multilabel_targets_are_checked_as_classes_or_their_end():
    # Each row's classes, up to a -1 that ends them; unchecked, a target of
    # the class count or past -1 ended the process in compiled code.
    class MultiLabel(torch.nn.Module):
        def forward(self, scores, targets):
            return F.multilabel_margin_loss(scores, targets, reduction="none")

    model = MultiLabel()
    scores, targets = torch.randn(2, 6), torch.tensor([[3, 0, -1, 5, 5, 5], [1, 2, 5, 4, -1, 0]])
    program, warned = fenced(model, (scores, targets), ({0: AUTO}, {0: AUTO}))
    assert len(warned) == 1
    assert ("aten.multilabel_margin_loss.default's class targets from targets: indices into dimension 1 "
            "(6) of scores, or -1 (the end of its targets)") in warned[0]
    assert torch.equal(program(scores, targets), model(scores, targets))
    for outside in (6, -2, 2**40):
        bad = targets.clone()
        bad[1, 0] = outside
        with pytest.raises(RuntimeError, match=r"or -1 \(the end of its targets\)"):
            program(scores, bad)


class Unpooled(torch.nn.Module):
    """SegNet's decoder: the encoder's pooling indices, from the request,
    place each value in its plane of the output, counted flat."""

    def __init__(self, output_size=None):
        super().__init__()
        self.output_size = output_size

    def forward(self, x, indices):
        return F.max_unpool2d(x, indices, 2, output_size=self.output_size)


def test_unpooling_indices_are_bounded_by_the_planes_of_the_output():
    # Unchecked, 1e8 ended the process and -5 wrote into another plane.
    x = torch.randn(2, 3, 2, 2)
    indices = torch.tensor([0, 5, 10, 15]).view(1, 1, 2, 2).expand(2, 3, 2, 2).contiguous()
    # Planes of a size given: the indices' values are bounded before the call.
    guards, warned = guards_and_warnings(Unpooled((4, 4)), (x, indices), ({0: AUTO}, {0: AUTO}))
    assert warned == [] and guards.index_ranges == ((1, 0, 16),)
    # Planes as large as the input makes them: checked as the code runs.
    model = Unpooled()
    program, warned = fenced(model, (x, indices), ({0: AUTO, 2: AUTO, 3: AUTO}, {0: AUTO, 2: AUTO, 3: AUTO}))
    assert len(warned) == 1
    assert "aten.max_unpool2d.default's indices from indices into each plane of its output" in warned[0]
    assert torch.equal(program(x, indices), model(x, indices))
    for outside in (16, -5, 10**8):
        bad = indices.clone()
        bad[1, 2, 0, 1] = outside
        with pytest.raises(RuntimeError, match="into each plane of its output"):
            program(x, bad)


class Classes(torch.nn.Module):
    def forward(self, labels, x):
        return F.one_hot(labels, 6).float() + F.one_hot((x.abs() * 2).long(), 6).float()


def test_one_hot_classes_are_bounded_as_indices():
    # Compiled, a class past 6 gave a row of zeros where eager refuses.
    labels, x = torch.tensor([0, 5, 2]), torch.tensor([0.3, 1.2, 2.9])
    guards, warned = guards_and_warnings(Classes(), (labels, x), ({0: AUTO}, {0: AUTO}))
    assert guards.index_ranges == ((0, 0, 6),)
    assert len(warned) == 1 and "aten.one_hot.default's indices from x into its 6 classes" in warned[0]
    model = Classes()
    program, _ = fenced(model, (labels, x), ({0: AUTO}, {0: AUTO}))
    assert torch.equal(program(labels, x), model(labels, x))
    with pytest.raises(RuntimeError, match="into its 6 classes"):
        program(labels, torch.tensor([0.3, 3.0, 2.9]))


class Strided(torch.nn.Module):
    def forward(self, x, step):
        return x.as_strided((2,), (step.item(),)) * 1.0


def test_a_view_whose_strides_come_from_values_is_checked_within_its_base():
    # Compiled, a stride of 1e8 read far past x (SIGSEGV) and 24 or -5 read
    # outside it, where eager refuses each.
    x, step = torch.rand(3, 8), torch.tensor(3)
    ep = torch.export.export(Strided(), (x, step), dynamic_shapes=({0: AUTO}, None))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        guards, _ = extract_guards(ep, [x, step], ["x", "step"])
    what = "aten.as_strided.default's sizes and strides from step: a view within the elements of x"
    assert what in guards.index_checks
    assert any(what in str(w.message) for w in caught)
    program = ep.module()
    assert torch.equal(program(x, torch.tensor(23)), x.as_strided((2,), (23,)))
    for outside in (24, 10**8, -5):
        with pytest.raises(RuntimeError, match="a view within the elements of x"):
            program(x, torch.tensor(outside))


def test_a_boolean_mask_is_not_taken_for_indices():
    # Fenced as indices, a mask of one True became rows 0 and 1: the
    # compiled variant answered valid calls wrongly.
    class Masked(torch.nn.Module):
        def forward(self, x, m):
            return x[m].sum(0)

    model = Masked()
    x, m = torch.arange(24.0).view(12, 2), torch.zeros(12, dtype=torch.bool)
    m[3] = True
    program, warned = fenced(model, (x, m), ({0: AUTO}, {0: AUTO}))
    assert warned == []
    assert torch.equal(program(x, m), model(x, m))


def test_probabilities_as_targets_index_nothing():
    class Soft(torch.nn.Module):
        def forward(self, scores, targets):
            return F.cross_entropy(scores, targets)

    _, warned = fenced(Soft(), (torch.randn(4, 5), torch.rand(4, 5)), ({0: AUTO}, {0: AUTO}))
    assert warned == []


class IndexedBy(torch.nn.Module):
    """An op that takes indices computed from a float input's values."""

    def __init__(self, op):
        super().__init__()
        self.op = op

    def forward(self, table, x):
        return self.op(table, (x * 3).long())


@pytest.mark.parametrize("op, within, outside", [
    # take counts a [4, 5] table's 20 elements flat, negative from the end.
    (lambda t, i: torch.take(t, i), [-20 / 3, 19 / 3], [20 / 3, -21 / 3]),
    (lambda t, i: t.index_add(0, i, torch.ones(i.shape[0], 5)), [0.0, 1.0], [4 / 3, -1 / 3]),
    (lambda t, i: t.index_copy(0, i, torch.ones(i.shape[0], 5)), [0.0, 1.0], [4 / 3, -1 / 3]),
    (lambda t, i: t.index_fill(0, i, 2.0), [-4 / 3, 1.0], [4 / 3, -5 / 3]),
    (lambda t, i: F.embedding_bag(i, t, torch.tensor([0])), [0.0, 1.0], [4 / 3, -1 / 3]),
    # In place, as the exported graph keeps them when the model wrote them so.
    (lambda t, i: t.clone().put_(i, torch.ones(i.shape[0])), [-20 / 3, 19 / 3], [20 / 3, -21 / 3]),
    (lambda t, i: t.clone().index_add_(0, i, torch.ones(i.shape[0], 5)), [0.0, 1.0], [4 / 3, -1 / 3]),
    (lambda t, i: t.clone().index_copy_(0, i, torch.ones(i.shape[0], 5)), [0.0, 1.0], [4 / 3, -1 / 3]),
    (lambda t, i: t.clone().index_fill_(0, i, 2.0), [-4 / 3, 1.0], [4 / 3, -5 / 3]),
    (lambda t, i: t.clone().index_put_((i,), torch.tensor(2.0)), [-4 / 3, 1.0], [4 / 3, -5 / 3]),
    (lambda t, i: t.clone().scatter_(0, i[:, None], 2.0), [0.0, 1.0], [4 / 3, -1 / 3]),
    # Unchecked, Inductor's mean over the rows indexed ended the process.
    (lambda t, i: t.index_reduce(0, i, torch.ones(i.shape[0], 5), "mean"), [0.0, 1.0], [4 / 3, -1 / 3]),
    (lambda t, i: t.clone().index_reduce_(0, i, torch.ones(i.shape[0], 5), "amax"), [0.0, 1.0],
     [4 / 3, -1 / 3]),
], ids=["take", "index_add", "index_copy", "index_fill", "embedding_bag",
        "put_", "index_add_", "index_copy_", "index_fill_", "index_put_", "scatter_",
        "index_reduce", "index_reduce_"])
def test_indices_of_ops_that_take_them_along_a_dimension_are_checked(op, within, outside):
    model = IndexedBy(op)
    table = torch.randn(4, 5)
    program, warned = fenced(model, (table, torch.tensor([0.0, 1.0])), (None, None))
    assert len(warned) == 1 and "checks them before the op reads them" in warned[0]
    x = torch.tensor(within) + 1e-4
    assert torch.equal(program(table, x), model(table, x))
    for value in outside:
        with pytest.raises(RuntimeError, match="'s indices from x into"):
            program(table, torch.tensor([0.0, value + (1e-4 if value > 0 else -1e-4)]))


class LastFrameMarkedInPlace(torch.nn.Module):
    """Wav2Vec2's and HuBERT's _get_feature_vector_attention_mask:
    z[(arange(batch), lengths - 1)] = 1, in place, the lengths counted from
    the mask. The exported graph keeps index_put_ as written: unrecognised,
    it was neither bounded nor checked, and a mask of 2s ended the server."""

    def forward(self, x, mask):
        z = torch.zeros(mask.shape, dtype=x.dtype)
        z[(torch.arange(x.shape[0]), mask.sum(-1) - 1)] = 1
        return x * z


def test_indices_put_in_place_are_bounded_as_those_put_out_of_place():
    x, mask = torch.randn(3, 16), torch.ones(3, 16, dtype=torch.int64)
    guards, warned = guards_and_warnings(LastFrameMarkedInPlace(), (x, mask),
                                         ({0: AUTO, 1: AUTO}, {0: AUTO, 1: AUTO}))
    assert warned == []
    assert guards.index_ranges == ((1, 0, 2),)


class NarrowAt(torch.nn.Module):
    def forward(self, x, start):
        return x.narrow(1, start.item(), 2) * 1.0


def test_the_programs_own_checks_of_values_it_reads_are_named_as_checks_of_the_call():
    # The compiled code asserts what narrow requires of start.item(); a call
    # that breaks it fails the run, which the server answers as the client's
    # doing only for a variant that lists the check (it answered 500).
    x, start = torch.rand(3, 8), torch.tensor(3)
    ep = torch.export.export(NarrowAt(), (x, start))
    guards, _ = extract_guards(ep, [x, start], ["x", "start"])
    assert len(guards.index_checks) == 1, guards.index_checks
    assert guards.index_checks[0].startswith("what the program requires of values it reads from start: ")
    assert "start.item() <= 8" in guards.index_checks[0]
    assert "more" in guards.index_checks[0]
    # Sizes alone: nothing the call's values could break.
    plain, _ = guards_and_warnings(torch.nn.Linear(8, 2), (x,), ({0: AUTO},))
    assert plain.index_checks == ()
