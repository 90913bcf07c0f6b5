"""Shape guards that torch.export keeps only as code, checked as the compiled
code runs (export_guards.py). Before, the capture dropped them: a token
classifier given labels of another size read past its logits, and a model
that branches on a product of sizes computed the other branch's answer.

Exports only (no AOTInductor compile): fast.
"""

import pytest
import torch
import torch.nn.functional as F
from torch.export import Dim

from precompile_capture.guards import extract_guards

AUTO = Dim.AUTO


def checked(module, args):
    """`module` exported with every dimension dynamic, its guards read, and
    its graph as the capture compiles it, run eagerly without export's own
    check of its guards code (which AOTInductor's package does not run)."""
    ep = torch.export.export(module, args, dynamic_shapes=tuple({0: AUTO, 1: AUTO} for _ in args), strict=True)
    guards, _ = extract_guards(ep, list(args))
    return guards.index_checks, ep.module(check_guards=False)


class TokenClassifier(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.head = torch.nn.Linear(4, 5)

    def forward(self, hidden, labels):
        return F.cross_entropy(self.head(hidden).view(-1, 5), labels.view(-1))


def test_a_loss_s_targets_must_be_one_for_each_row():
    model = TokenClassifier()
    hidden, labels = torch.randn(2, 8, 4), torch.randint(0, 5, (2, 8))
    checks, program = checked(model, (hidden, labels))
    guard = "shape guard: (hidden.size(1)*hidden.size(0)) == (labels.size(0)*labels.size(1))"
    assert guard in checks
    assert torch.equal(program(hidden, labels), model(hidden, labels))
    # 30 rows as 2 x 15 labels, as eager takes them.
    hidden, labels = torch.randn(3, 10, 4), torch.randint(0, 5, (2, 15))
    assert torch.equal(program(hidden, labels), model(hidden, labels))
    for shape in ((3, 9), (3, 11), (2, 4000)):
        with pytest.raises(RuntimeError, match=r"shape guard: \(hidden.size\(1\)\*hidden.size\(0\)\)"):
            program(torch.randn(3, 10, 4), torch.zeros(shape, dtype=torch.int64))


class Branch(torch.nn.Module):
    def forward(self, x):
        return x * 2 if x.shape[0] * x.shape[1] > 100 else x


def test_a_branch_on_a_product_of_sizes_is_not_taken_for_the_other_side():
    checks, program = checked(Branch(), (torch.randn(3, 8),))
    assert checks == ("shape guard: x.size(1)*x.size(0) <= 100",)
    assert torch.equal(program(torch.ones(4, 25)), torch.ones(4, 25))
    with pytest.raises(RuntimeError, match=r"shape guard: x.size\(1\)\*x.size\(0\) <= 100"):
        program(torch.ones(4, 26))


def test_guards_the_symbols_ranges_imply_are_not_checked_again():
    # BERT-like: sizes equal and a position table's bound are the guards'
    # own (one symbol, a symbol's range), not checks.
    class Positions(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.table = torch.nn.Embedding(16, 4)

        def forward(self, ids, mask):
            return self.table(torch.arange(ids.shape[1])) * mask.unsqueeze(-1)

    checks, _ = checked(Positions(), (torch.zeros(2, 8, dtype=torch.int64), torch.ones(2, 8)))
    assert not [c for c in checks if c.startswith("shape guard")]


def test_a_guard_the_capture_cannot_read_is_warned_of():
    class Wide(torch.nn.Module):
        def forward(self, x):
            return x * 2 if max(x.shape[0], x.shape[1]) > 50 else x

    ep = torch.export.export(Wide(), (torch.randn(3, 8),), dynamic_shapes=({0: AUTO, 1: AUTO},), strict=True)
    unreadable = [g for g in ep._guards_code if "max" in g.lower()]
    if not unreadable:
        pytest.skip(f"export wrote this guard as plain arithmetic: {ep._guards_code}")
    with pytest.warns(RuntimeWarning, match="which the capture cannot read"):
        extract_guards(ep, [torch.randn(3, 8)])
