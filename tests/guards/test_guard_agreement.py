"""The capture's guard evaluator and the runtime's agree.

The capture decides, call by call, whether an existing variant covers a call
(capture/precompile_capture/guards.py, GuardSet.holds); the server decides
the same with its compiled guard programs (runtime/guard_program.cc). If they
disagreed, the capture would think a call covered that the server refuses, or
the server would run a variant the capture never meant for that call. The
runtime's evaluator is the reference.

Hypothesis generates guard sets of every kind (dtypes, devices, ranks, static
sizes, size symbols with ranges shared between tensors, None, bool, int,
float with NaN, str, the global state) and calls near them; each is written
as the manifest would write it (artifact.guards_proto) and sent to
`guard_eval`, which runs the runtime's GuardProgram on it.

Runs under Bazel (//tests/guards:guard_agreement_test).
"""

import math
import os
import sys

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from evaluators import DTYPES, python_holds, runtime_record  # noqa: E402
from precompile_capture.guards import ArgGuard, Dim, GuardSet, SymbolRange, TensorSpec  # noqa: E402

DEFAULT_DTYPES = [torch.float32, torch.float64]
FLOATS = [0.0, -0.0, 0.5, 1.0, 2.0, math.inf, -math.inf, math.nan, 1e300]
INTS = [0, 1, -1, 2, 7, 2**62, -(2**63)]
STRINGS = ["", "a", "mean", "é"]


# -- what the strategies draw -------------------------------------------------
# A parameter: ("tensor", dtype, device, dims) where each dim is ("static", n)
# or ("symbol", id); ("none",); or ("value", python value).

def tensor_params(symbols):
    dim = st.one_of(st.tuples(st.just("static"), st.integers(0, 5)),
                    st.tuples(st.just("symbol"), st.sampled_from(symbols)))
    return st.tuples(st.just("tensor"), st.sampled_from(DTYPES), st.sampled_from(["cpu", "cuda"]),
                     st.lists(dim, max_size=3))


scalar_values = st.one_of(st.booleans(), st.sampled_from(INTS), st.integers(-3, 3),
                          st.sampled_from(FLOATS), st.sampled_from(STRINGS))


@st.composite
def guard_sets(draw):
    symbols = [0, 1, 2]
    params = draw(st.lists(st.one_of(tensor_params(symbols), st.just(("none",)),
                                     st.tuples(st.just("value"), scalar_values)),
                           min_size=1, max_size=4))
    ranges = []
    for s in symbols:
        low = draw(st.integers(0, 4))
        high = draw(st.one_of(st.none(), st.integers(low, low + 4)))
        ranges.append(SymbolRange(symbol=s, min=low, max=high, name=f"s{s}"))
    args = []
    for i, p in enumerate(params):
        if p[0] == "tensor":
            dims = tuple(Dim(static=n) if kind == "static" else Dim(symbol=n) for kind, n in p[3])
            args.append(ArgGuard(parameter=i, tensor=TensorSpec(dtype=p[1], device=p[2], dims=dims)))
        elif p[0] == "none":
            args.append(ArgGuard(parameter=i, is_none=True))
        else:
            args.append(ArgGuard(parameter=i, has_value=True, value=p[1]))
    used = {d.symbol for a in args if a.tensor for d in a.tensor.dims if d.symbol is not None}
    guards = GuardSet(args=tuple(args), symbols=tuple(r for r in ranges if r.symbol in used),
                      grad_enabled=draw(st.booleans()),
                      default_dtype=draw(st.sampled_from(DEFAULT_DTYPES)))
    return params, guards


@st.composite
def calls(draw, params, guards):
    """A call near the guards: each argument as guarded, or changed a little."""
    bound = {}
    ranges = {r.symbol: r for r in guards.symbols}
    values = []
    for p in params:
        near = draw(st.booleans()) or draw(st.booleans())  # mostly as guarded
        if p[0] == "tensor" and near:
            shape = []
            for kind, n in p[3]:
                if kind == "static":
                    shape.append(n if draw(st.integers(0, 4)) else draw(st.integers(0, 6)))
                else:
                    if n not in bound:
                        r = ranges[n]
                        top = r.max if r.max is not None else r.min + 8
                        bound[n] = draw(st.integers(max(0, r.min - 1), top + 1))
                    shape.append(bound[n] if draw(st.integers(0, 4)) else draw(st.integers(0, 9)))
            if not draw(st.integers(0, 5)):
                shape.append(1)  # another rank
            dtype = p[1] if draw(st.integers(0, 4)) else draw(st.sampled_from(DTYPES))
            device = p[2] if draw(st.integers(0, 4)) else draw(st.sampled_from(["cpu", "cuda"]))
            values.append(("tensor", dtype, device, shape))
        elif p[0] == "none" and near:
            values.append(None)
        elif p[0] == "value" and near:
            values.append(p[1])
        else:
            values.append(draw(st.one_of(st.none(), scalar_values,
                                         st.tuples(st.just("tensor"), st.sampled_from(DTYPES),
                                                   st.just("cpu"),
                                                   st.lists(st.integers(0, 5), max_size=3)))))
    return (values, draw(st.booleans()) if draw(st.integers(0, 3)) == 0 else guards.grad_enabled,
            draw(st.sampled_from(DEFAULT_DTYPES)) if draw(st.integers(0, 3)) == 0
            else guards.default_dtype)


# How often the generated calls held, and did not: the last test checks that
# the agreement covered both answers.
OUTCOMES = {"0": 0, "1": 0}


@settings(max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_the_capture_and_the_runtime_decide_alike(runtime, data):
    params, guards = data.draw(guard_sets())
    values, grad, default_dtype = data.draw(calls(params, guards))
    expected = runtime(runtime_record(params, guards, values, grad, default_dtype))
    got = python_holds(guards, values, grad, default_dtype)
    assert expected in ("0", "1"), expected
    OUTCOMES[expected] += 1
    assert got == (expected == "1"), (
        f"the capture says {got}, the runtime {expected}, for guards "
        f"{guards.describe([f'a{i}' for i in range(len(params))])} on {values} "
        f"(grad {grad}, default dtype {default_dtype})"
    )


@pytest.mark.parametrize("expected, actual, holds", [
    (math.nan, math.nan, True), (0.5, 0.5, True), (2.0, 2, False), (2, 2.0, False),
    (1, True, False), (True, 1, False), (0.0, -0.0, True), ("a", "a", True), (None, None, True),
])
def test_scalar_equality_examples_agree(runtime, expected, actual, holds):
    params = [("value", expected)]
    guards = GuardSet(args=(ArgGuard(parameter=0, has_value=True, value=expected),), symbols=(),
                      grad_enabled=False, default_dtype=torch.float32)
    assert runtime(runtime_record(params, guards, [actual], False, torch.float32)) == ("1" if holds else "0")
    assert python_holds(guards, [actual], False, torch.float32) is holds


def test_the_generated_calls_both_hold_and_miss():
    """Runs after the property above (pytest keeps the file's order)."""
    assert OUTCOMES["1"] >= 300 and OUTCOMES["0"] >= 300, OUTCOMES
