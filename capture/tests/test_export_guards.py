"""Shape guards that torch.export keeps only as code become guards of the
variant (export_guards.py). Before, the capture dropped them: a token
classifier given labels of another size read past its logits, and a model
that branches on a product of sizes computed the other branch's answer.

Exports only (no AOTInductor compile): fast.
"""

import dataclasses
import re
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch.export import Dim

from precompile_capture.artifact import guards_from_proto, guards_proto
from precompile_capture.frames import Kind
from precompile_capture.guards import evaluate_size_program, extract_guards
from proto import artifact_pb2 as pb

AUTO = Dim.AUTO


def exported(module, args):
    """`module` exported with every dimension dynamic, and its guards."""
    ep = torch.export.export(module, args, dynamic_shapes=tuple({0: AUTO, 1: AUTO} for _ in args), strict=True)
    guards, _ = extract_guards(ep, list(args))
    return guards, ep


def saved(guards, arity):
    """`guards` written into a manifest's variant and read back, as a
    recapture reads them."""
    variant = pb.Variant(id="forward#0")
    guards_proto(variant, guards, [Kind.TENSOR] * arity)
    return guards_from_proto(variant)


def guard_fails(module, *args):
    """torch.export's own check of its guards code refuses `args`."""
    try:
        module(*args)
    except AssertionError as e:
        assert "Guard failed" in str(e), e
        return True
    return False


class TokenClassifier(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.head = torch.nn.Linear(4, 5)

    def forward(self, hidden, labels):
        return F.cross_entropy(self.head(hidden).view(-1, 5), labels.view(-1))


def test_a_loss_s_targets_must_be_one_for_each_row():
    hidden, labels = torch.randn(2, 8, 4), torch.randint(0, 5, (2, 8))
    guards, ep = exported(TokenClassifier(), (hidden, labels))
    assert [r.text for r in guards.size_relations] == [
        "(hidden.size(1)*hidden.size(0)) == (labels.size(0)*labels.size(1))"]
    assert "shape guard: (hidden.size(1)*hidden.size(0))" in guards.describe(["hidden", "labels"])
    module = ep.module()
    for g in (guards, saved(guards, 2)):
        # 30 rows as 2 x 15 labels, as eager takes them.
        assert g.holds([torch.randn(3, 10, 4), torch.zeros(2, 15, dtype=torch.int64)])
        for shape in ((3, 9), (3, 11), (2, 4000)):
            call = [torch.randn(3, 10, 4), torch.zeros(shape, dtype=torch.int64)]
            assert not g.holds(call), shape
            assert guard_fails(module, *call), shape


class Branch(torch.nn.Module):
    def forward(self, x):
        return x * 2 if x.shape[0] * x.shape[1] > 100 else x


def test_a_branch_on_a_product_of_sizes_is_not_taken_for_the_other_side():
    guards, _ = exported(Branch(), (torch.randn(3, 8),))
    assert [r.text for r in guards.size_relations] == ["x.size(1)*x.size(0) <= 100"]
    assert guards.holds([torch.ones(4, 25)])
    assert not guards.holds([torch.ones(4, 26)])
    # The other side is a variant of its own, with the opposite guard.
    other, _ = exported(Branch(), (torch.randn(30, 8),))
    assert [r.text for r in other.size_relations] == ["x.size(1)*x.size(0) > 100"]
    assert other.holds([torch.ones(4, 26)]) and not other.holds([torch.ones(4, 25)])


def test_a_relation_s_arithmetic_is_the_runtime_s():
    # runtime/size_program.cc: any sign, Python's floor division, and no
    # value past 64 bits (a tensor of 2^62 x 8 rows with a dimension of 0
    # is a request of no bytes).
    product = [("symbol", 0), ("symbol", 1), ("op", "MUL")]
    assert evaluate_size_program(product, {0: 2**60, 1: 7}) == 7 * 2**60
    assert evaluate_size_program(product, {0: 2**62, 1: 8}) is None
    difference = [("constant", 3), ("symbol", 0), ("constant", -1), ("op", "MUL"), ("op", "ADD")]
    assert evaluate_size_program(difference, {0: 10}) == -7
    assert evaluate_size_program([("constant", -7), ("symbol", 0), ("op", "FLOOR_DIV")], {0: 2}) == -4
    assert evaluate_size_program([("symbol", 0), ("constant", 0), ("op", "MOD")], {0: 2}) is None
    assert evaluate_size_program(product, {0: 2}) is None


def test_guards_the_symbols_ranges_imply_are_no_relations():
    # BERT-like: sizes equal and a position table's bound are the guards'
    # own (one symbol, a symbol's range).
    class Positions(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.table = torch.nn.Embedding(16, 4)

        def forward(self, ids, mask):
            return self.table(torch.arange(ids.shape[1])) * mask.unsqueeze(-1)

    guards, _ = exported(Positions(), (torch.zeros(2, 8, dtype=torch.int64), torch.ones(2, 8)))
    assert guards.size_relations == ()


class Wide(torch.nn.Module):
    def forward(self, x):
        return x * 2 if max(x.shape[0], x.shape[1]) > 50 else x


def test_a_guard_on_the_larger_of_two_sizes_is_a_relation():
    # Pooling with ceil_mode writes its output sizes with max(): GoogLeNet's
    # and Inception's guards hold such products.
    guards, ep = exported(Wide(), (torch.randn(3, 8),))
    assert any("max(" in g for g in ep._guards_code), ep._guards_code
    assert [r.text for r in guards.size_relations] == ["max(x.size(1), x.size(0)) <= 50"]
    module = ep.module()
    for g in (guards, saved(guards, 1)):
        assert g.holds([torch.randn(50, 2)]) and g.holds([torch.randn(2, 50)])
        for shape in ((51, 2), (2, 51), (60, 60)):
            assert not g.holds([torch.randn(shape)]), shape
            assert guard_fails(module, torch.randn(shape)), shape


def test_a_guard_the_capture_cannot_read_is_warned_of():
    from precompile_capture.export_guards import export_size_relations

    ep = torch.export.export(Branch(), (torch.randn(3, 8),), dynamic_shapes=({0: AUTO, 1: AUTO},), strict=True)
    ep._guards_code = ["abs(L['flat_args'][0].size()[0]) > 2"]
    with pytest.warns(RuntimeWarning, match="guards the sizes with 'abs\\(x.size\\(0\\)\\) > 2', which the "
                                            "capture cannot read"):
        assert export_size_relations(ep, lambda expr: [("symbol", 0)], ["x"]) == []


def test_a_relation_deeper_than_the_server_evaluates_is_warned_of():
    # The server refuses to load a side holding more than 16 values at once
    # (runtime/size_program.h); the capture warns instead of writing one.
    from precompile_capture.export_guards import export_size_relations

    ep = torch.export.export(Branch(), (torch.randn(3, 8),), dynamic_shapes=({0: AUTO, 1: AUTO},), strict=True)

    def nested(values):
        return [("symbol", 0)] * values + [("op", "ADD")] * (values - 1)

    assert len(export_size_relations(ep, lambda expr: nested(16), ["x"])) == 1
    with pytest.warns(RuntimeWarning, match="nested deeper than the server evaluates"):
        assert export_size_relations(ep, lambda expr: nested(17), ["x"]) == []


def _with_guards_code(code):
    """Branch exported, its guards code replaced by `code` (x's sizes as
    torch.export writes them), and the guards the capture reads of it."""
    ep = torch.export.export(Branch(), (torch.randn(3, 8),), dynamic_shapes=({0: AUTO, 1: AUTO},), strict=True)
    ep._guards_code = [c.replace("x0", "L['flat_args'][0].size()[0]").replace("x1", "L['flat_args'][0].size()[1]")
                       for c in code]
    guards, _ = extract_guards(ep, [torch.randn(3, 8)])
    return guards


def test_guards_joined_by_and_are_each_a_relation():
    guards = _with_guards_code(["x0*x1 <= 100 and (x0 != 7 and x1 != 9)"])
    assert [r.text for r in guards.size_relations] == [
        "x.size(0)*x.size(1) <= 100", "x.size(0) != 7", "x.size(1) != 9"]
    for g in (guards, saved(guards, 1)):
        assert g.holds([torch.randn(4, 25)])
        for shape in ((5, 25), (7, 2), (2, 9)):
            assert not g.holds([torch.randn(shape)]), shape


def test_a_ceiling_of_sizes_is_read_as_a_floor_division():
    # MobileViT's and pooling's guards count patches so: math.ceil(n / 2).
    guards = _with_guards_code(["math.ceil(x0 / 4) <= 2"])
    assert [r.text for r in guards.size_relations] == ["math.ceil(x.size(0) / 4) <= 2"]
    for g in (guards, saved(guards, 1)):
        assert g.holds([torch.randn(8, 3)]) and g.holds([torch.randn(5, 3)])
        assert not g.holds([torch.randn(9, 3)])


def test_a_guard_joined_by_or_is_none_where_the_ranges_imply_it_and_warned_of_otherwise():
    # x.size(0) takes sizes from 2: the first holds whatever the second says.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _with_guards_code(["x0 >= 2 or x1 == 5"]).size_relations == ()
    with pytest.warns(RuntimeWarning, match=r"guards the sizes with 'x.size\(0\) == 3 or x.size\(1\) == 5', "
                                            "which the capture cannot read"):
        assert _with_guards_code(["x0 == 3 or x1 == 5"]).size_relations == ()


def test_many_guards_the_capture_cannot_read_are_warned_of_in_short():
    # timm's tf_efficientnet pads "same" from each layer's size: with height
    # and width dynamic, torch.export kept 67 guards, each thousands of
    # characters long, that the capture cannot read; warned of one by one,
    # they were a megabyte of warnings.
    deep = "abs(" * 300 + "x1" + ")" * 300
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        guards = _with_guards_code([f"{deep} != {n}" for n in range(8)])
    assert guards.size_relations == ()
    said = [str(w.message) for w in caught if "cannot read" in str(w.message)]
    assert len(said) == 4, said
    # The first three one by one, each shown in part, saying how long it is.
    for message in said[:3]:
        assert re.search(r"with 'abs\(abs\(.*\.\.\. \(1\d{3} characters\)'", message), message[:600]
        assert len(message) < 1500, len(message)
    assert said[3].startswith("precompile capture: torch.export keeps 5 more guards of the sizes that the "
                              "capture cannot read (of x.size(1)): calls that break them"), said[3]
    assert "captured fixed" in said[3]


class NarrowOnly(torch.nn.Module):
    """One path up to a width of 8 and another above: exported from a narrow
    call, the variant serves widths up to 8 only, though eager runs wider."""

    def forward(self, x):
        return x * 2 if x.shape[-1] <= 8 else x.sum(-1)


def test_a_ceiling_the_model_s_code_sets_is_told_apart_from_a_table_s():
    from precompile_capture.capture import size_steps
    from types import SimpleNamespace

    x = torch.randn(2, 3, 6)
    ep = torch.export.export(NarrowOnly(), (x,), dynamic_shapes=({2: AUTO},), strict=True)
    guards, _ = extract_guards(ep, [x], ["x"])
    width = next(d.symbol for d in guards.args[0].tensor.dims if d.symbol is not None)
    assert [(r.min, r.max) for r in guards.symbols if r.symbol == width] == [(2, 8)]
    assert guards.code_ceilings == ((width, 8),)
    variants = [SimpleNamespace(guards=guards)]
    assert size_steps(variants, [x], ["x"]) == ["x.size(2) up to 8 and at none above"]
    # At the top there is nothing above to name; a top that is not the
    # code's (a table's length, --max-size) is not the code's to explain.
    assert size_steps(variants, [torch.randn(2, 3, 8)], ["x"]) == ["x.size(2) at 8 and at none of 9 to 72"]
    not_the_code_s = SimpleNamespace(guards=dataclasses.replace(guards, code_ceilings=()))
    assert size_steps([not_the_code_s], [x], ["x"]) == []
    # Not saved with the guards, and not what makes two guard sets equal.
    assert saved(guards, 1).code_ceilings == () and saved(guards, 1) == guards
