"""torch.export's own input checks agree with the capture's and the runtime's
guards, on the guards torch.export itself derives.

Hypothesis draws a signature (tensors whose dimensions are static or shared
size symbols with a range, and specialized int, float, bool and str
arguments), exports a function of it with those dynamic shapes, reads the
guards off the exported program as the capture does (extract_guards), and
sends calls near them to four evaluators:

- the runtime's GuardProgram (guard_eval), the reference;
- the capture's GuardSet.holds;
- torch.export's input check (_check_input_constraints_for_graph), which
  ExportedProgram runs on its inputs;
- the guards of the module torch.export unlifts (ep.module()), which users
  call.

torch.export checks shapes, ranks and specialized values, not dtypes,
devices or global state: the calls vary only what it checks. The capture
agrees with the runtime on every call. torch.export differs in ways that are
known, and pinned here so that a change on either side shows:

- a NaN-specialized float: the runtime matches NaN to NaN (the compiled code
  behaves the same for every NaN); the input check refuses it (NaN != NaN),
  and the module's guard code cannot run at all (it names an undefined
  `nan`).
- sizes 0 and 1 of a size symbol whose lower bound is at most 2: torch.export
  lets them through ("we allow dimensions to be 0/1 at runtime"); the runtime
  refuses every size outside the range, since the compiled code may assume
  it.
- the module's guards do not check ranks, and compare values with ==, so
  2.0 passes for 2 and 1 for True; the runtime and the input check refuse.

Runs under Bazel (//tests/guards:export_agreement_test).
"""

import math
import os
import sys

import pytest
import torch
import torch.utils._pytree as pytree
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from torch._export.utils import _check_input_constraints_for_graph
from torch.export.graph_signature import InputKind

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from evaluators import python_holds, runtime_record  # noqa: E402
from precompile_capture.guards import extract_guards  # noqa: E402

SCALARS = st.one_of(st.booleans(), st.integers(-3, 3), st.sampled_from([0.5, -1.0, 2.0, math.nan]),
                    st.sampled_from(["", "mean", "sum"]))


class Function(torch.nn.Module):
    """Uses every argument, constrains no shape: the exported guards are
    exactly the dynamic shapes and the specializations."""

    def forward(self, *args):
        out = torch.zeros(())
        for a in args:
            out = out + (a.sum() if isinstance(a, torch.Tensor) else len(str(a)))
        return out


@st.composite
def signatures(draw):
    """(params, dims): params as evaluators.runtime_record takes them; dims
    per tensor parameter, each ("static", n) or ("symbol", k); ranges per
    symbol, (min, max or None)."""
    ranges = []
    for _ in range(2):
        low = draw(st.integers(0, 3))
        example = max(low, 2)  # 0 and 1 would be specialized by the export
        ranges.append((low, draw(st.one_of(st.none(), st.integers(example + 1, example + 5)))))
    dim = st.one_of(st.tuples(st.just("static"), st.integers(0, 4)),
                    st.tuples(st.just("symbol"), st.integers(0, 1)))
    params = draw(st.lists(
        st.one_of(st.tuples(st.just("tensor"), st.just(torch.float32), st.just("cpu"),
                            st.lists(dim, max_size=3)),
                  st.tuples(st.just("value"), SCALARS)),
        min_size=1, max_size=4))
    return params, ranges


def export(params, ranges):
    symbols = [torch.export.Dim(f"s{k}", min=low, max=high) for k, (low, high) in enumerate(ranges)]
    args, shapes = [], []
    for p in params:
        if p[0] == "tensor":
            args.append(torch.zeros([n if kind == "static" else max(ranges[n][0], 2) for kind, n in p[3]]))
            shapes.append({d: symbols[n] for d, (kind, n) in enumerate(p[3]) if kind == "symbol"} or None)
        else:
            args.append(p[1])
            shapes.append(None)
    ep = torch.export.export(Function(), tuple(args), dynamic_shapes=(tuple(shapes),), strict=True)
    guards, _ = extract_guards(ep, args)
    return ep, guards


@st.composite
def calls(draw, params, ranges):
    """A call near the signature: sizes in and just outside the ranges,
    symbols bound alike or not, another rank, another value or kind."""
    bound = {}
    values = []
    for p in params:
        if p[0] == "tensor":
            shape = []
            for kind, n in p[3]:
                if kind == "static":
                    shape.append(n if draw(st.integers(0, 3)) else draw(st.integers(0, 5)))
                else:
                    low, high = ranges[n]
                    if n not in bound:
                        bound[n] = draw(st.integers(max(0, low - 1), (high if high is not None else low + 6) + 1))
                    shape.append(bound[n] if draw(st.integers(0, 3)) else draw(st.integers(0, 8)))
            if not draw(st.integers(0, 7)):
                shape.append(1)
            values.append(("tensor", torch.float32, "cpu", shape))
        else:
            v = p[1]
            choice = draw(st.integers(0, 5))
            if choice == 0:
                v = draw(SCALARS)
            elif choice == 1 and isinstance(v, bool):
                v = int(v)  # same value under ==, another kind
            elif choice == 1 and isinstance(v, int):
                v = float(v)
            values.append(v)
    return values


def input_check(ep, args):
    """ExportedProgram's input check: does it accept `args`?"""
    user = {s.arg.name for s in ep.graph_signature.input_specs if s.kind == InputKind.USER_INPUT}
    placeholders = [n for n in ep.graph.nodes if n.op == "placeholder" and n.name in user]
    flat, _ = pytree.tree_flatten_with_path((tuple(args), {}))
    try:
        _check_input_constraints_for_graph(placeholders, flat, ep.range_constraints)
    except RuntimeError:
        return False
    return True


def module_guards(module, args):
    """The unlifted module's guards: does a call with `args` pass them?"""
    try:
        module(*args)
    except AssertionError as e:
        assert "Guard failed" in str(e), e
        return False
    return True


def loosely_equal(expected, actual):
    """== across kinds (2 == 2.0, True == 1), which the runtime refuses."""
    return type(expected) is not type(actual) and expected == actual


def is_nan(value):
    return isinstance(value, float) and math.isnan(value)


def small_sizes_raised(guards, values):
    """The call with each size 0 or 1 that is below its symbol's lower bound
    (at most 2) raised to that bound: what torch.export's checks take it for."""
    lows = {r.symbol: r.min for r in guards.symbols}
    raised = list(values)
    for g in guards.args:
        v = values[g.parameter]
        if g.tensor is None or not isinstance(v, tuple) or len(v[3]) != len(g.tensor.dims):
            continue
        shape = [lows[d.symbol] if d.symbol is not None and size in (0, 1) and size < lows[d.symbol] <= 2
                 else size for d, size in zip(g.tensor.dims, v[3])]
        raised[g.parameter] = (*v[:3], shape)
    return raised


def rank_changed(params, values):
    return any(p[0] == "tensor" and len(v[3]) != len(p[3]) for p, v in zip(params, values))


# How often each answer and each known difference occurred.
OUTCOMES = {"0": 0, "1": 0, "nan": 0, "small sizes": 0, "rank": 0, "kind": 0}


# Each example exports a program: no shrinking (it would export thousands),
# the failure message names the guards and the call instead. The same
# examples every run (derandomize): the counts the last tests check are then
# a fact of the code, not a draw (a random run once fell short of them).
@settings(max_examples=100, deadline=None, phases=[Phase.generate], derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_torch_export_checks_agree_with_the_guards(runtime, data):
    params, ranges = data.draw(signatures())
    ep, guards = export(params, ranges)
    module = ep.module()
    grad, default_dtype = torch.is_grad_enabled(), torch.get_default_dtype()

    def decide(values):
        answer = runtime(runtime_record(params, guards, values, grad, default_dtype))
        assert answer in ("0", "1"), answer
        return answer == "1"

    nan_guarded = any(p[0] == "value" and is_nan(p[1]) for p in params)
    for _ in range(12):
        values = data.draw(calls(params, ranges))
        args = [torch.zeros(v[3]) if isinstance(v, tuple) else v for v in values]
        holds = decide(values)
        OUTCOMES["1" if holds else "0"] += 1
        where = f"guards {guards.describe([f'a{i}' for i in range(len(params))])} on {values}"
        assert python_holds(guards, values, grad, default_dtype) == holds, f"the capture differs: {where}"

        checked = input_check(ep, args)
        nan_call = any(p[0] == "value" and is_nan(p[1]) and is_nan(v) for p, v in zip(params, values))
        if nan_call and holds:
            assert not checked, f"the input check took NaN for NaN: {where}"
            OUTCOMES["nan"] += 1
        elif checked and not holds:
            assert decide(small_sizes_raised(guards, values)), f"the input check is looser: {where}"
            OUTCOMES["small sizes"] += 1
        else:
            assert checked == holds, f"the input check is stricter: {where}"

        if nan_guarded:
            # The guard code stops at an earlier failing guard, or at `nan`.
            with pytest.raises((NameError, AssertionError), match="nan|Guard failed"):
                module(*args)
            continue
        passed = module_guards(module, args)
        if passed and not checked:
            loose = any(p[0] == "value" and loosely_equal(p[1], v) for p, v in zip(params, values))
            assert loose or rank_changed(params, values), f"the module's guards are looser: {where}"
            OUTCOMES["kind" if loose else "rank"] += 1
        else:
            assert passed == checked, f"the module's guards are stricter: {where}"


def test_the_generated_calls_both_hold_and_miss():
    """Runs after the property above (pytest keeps the file's order)."""
    assert OUTCOMES["1"] >= 60 and OUTCOMES["0"] >= 60, OUTCOMES


class Related(torch.nn.Module):
    """Sizes related by guards torch.export keeps only as code (which
    `ep.module()` checks and AOTInductor's package does not run): a's
    elements viewed as b's (s0*s1 == s2*s3), a's elements in rows of 4
    (divisibility), a branch on a's number of elements."""

    def __init__(self, kinds):
        super().__init__()
        self.kinds = kinds

    def forward(self, a, b):
        out = a.sum() + b.sum()
        if "view" in self.kinds:
            out = out + (a.reshape(-1) * b.reshape(-1)).sum()
        if "rows of 4" in self.kinds:
            out = out + a.reshape(-1, 4).sum(dim=1).max()
        if "branch" in self.kinds:
            out = out * 2 if a.shape[0] * a.shape[1] > 24 else out - 1
        return out


RELATED = {"0": 0, "1": 0, "relation": 0}


@st.composite
def factored(draw, elements):
    """Two sizes of at least 2 whose product is `elements`, when there are."""
    pairs = [(d, elements // d) for d in range(2, elements // 2 + 1) if elements % d == 0]
    return draw(st.sampled_from(pairs)) if pairs else (2, 2)


@settings(max_examples=25, deadline=None, phases=[Phase.generate], derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_relations_between_sizes_agree_with_torch_export_s_guards_code(runtime, data):
    kinds = data.draw(st.sets(st.sampled_from(["view", "rows of 4", "branch"]), min_size=1))
    rows, columns = data.draw(st.sampled_from([(2, 4), (3, 4), (2, 6), (4, 4), (3, 8), (4, 8), (5, 8)]))
    b_shape = data.draw(factored(rows * columns)) if "view" in kinds else (3, 5)
    example = (torch.randn(rows, columns), torch.randn(*b_shape))
    ep = torch.export.export(Related(kinds), example, dynamic_shapes=({0: torch.export.Dim.AUTO, 1: torch.export.Dim.AUTO},) * 2,
                             strict=True)
    guards, _ = extract_guards(ep, list(example))
    module = ep.module()
    grad, default_dtype = torch.is_grad_enabled(), torch.get_default_dtype()
    params = [("tensor",), ("tensor",)]
    for _ in range(12):
        # Sizes of at least 2, inside every symbol's range (torch.export
        # lets 0 and 1 through, above): calls differ on the relations only.
        a = (data.draw(st.integers(2, 9)), data.draw(st.integers(2, 9)))
        b = data.draw(factored(a[0] * a[1])) if data.draw(st.booleans()) else \
            (data.draw(st.integers(2, 9)), data.draw(st.integers(2, 9)))
        values = [("tensor", torch.float32, "cpu", list(a)), ("tensor", torch.float32, "cpu", list(b))]
        answer = runtime(runtime_record(params, guards, values, grad, default_dtype))
        assert answer in ("0", "1"), answer
        holds = answer == "1"
        where = f"{sorted(kinds)}: guards {guards.describe(['a', 'b'])} on {a}, {b}"
        assert python_holds(guards, values, grad, default_dtype) == holds, f"the capture differs: {where}"
        assert module_guards(module, [torch.randn(*a), torch.randn(*b)]) == holds, \
            f"torch.export's guards code differs: {where}"
        RELATED["1" if holds else "0"] += 1
    RELATED["relation"] += len(guards.size_relations)


def test_the_related_calls_both_hold_and_miss():
    assert RELATED["1"] >= 40 and RELATED["0"] >= 40 and RELATED["relation"] >= 25, RELATED
