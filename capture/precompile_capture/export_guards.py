"""Guards torch.export keeps only as code, checked as the compiled code runs.

An exported program's shape guards that are not a symbol's range or two
sizes being one (which the capture's guards express: guards.py) survive
only in `ExportedProgram._guards_code`, Python that `ep.module()` runs
before each call and that AOTInductor's package never runs: a product of
sizes against another (a token classifier's logits.view(-1, C) against
labels.view(-1)), a divisibility (a reshape into heads), the side of a
branch on a product of sizes. Compiled code given a call that breaks one
reads past its buffers or computes the other branch's answer.

Each such guard is asserted in the exported graph before it is compiled:
`_assert_scalar` of a size expression, which AOTInductor checks in its
wrapper before any kernel, so that such a call fails as a call. The capture
describes each in the variant's run-time checks. (Such a call is one that
Dynamo would not match with the variant: as a check it fails, where a guard
would miss and the server would look for another variant.)
"""

from __future__ import annotations

import ast
import operator
import re
import warnings
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch
from torch.export.graph_signature import InputKind

_aten = torch.ops.aten
_SIZE = re.compile(r"L\['flat_args'\]\[(\d+)\]\.size\(\)\[(\d+)\]")
_ARITHMETIC: Dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
}
_COMPARISON: Dict[type, Callable[[Any, Any], Any]] = {
    ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
    ast.Gt: operator.gt, ast.GtE: operator.ge,
}


class _Unreadable(Exception):
    pass


def _evaluate(tree: ast.AST, size: Callable[[int, int], Any], apply: Callable[..., Any]) -> Any:
    """A guard's value: sizes from `size`, operations through `apply`."""
    if isinstance(tree, ast.Expression):
        return _evaluate(tree.body, size, apply)
    if isinstance(tree, ast.Constant) and isinstance(tree.value, int) and not isinstance(tree.value, bool):
        return tree.value
    if isinstance(tree, ast.Subscript):
        match = _SIZE.fullmatch(ast.unparse(tree))
        if match is None:
            raise _Unreadable(ast.unparse(tree))
        return size(int(match.group(1)), int(match.group(2)))
    if isinstance(tree, ast.UnaryOp) and isinstance(tree.op, ast.USub):
        return apply(operator.neg, _evaluate(tree.operand, size, apply))
    if isinstance(tree, ast.BinOp) and type(tree.op) in _ARITHMETIC:
        return apply(_ARITHMETIC[type(tree.op)], _evaluate(tree.left, size, apply),
                     _evaluate(tree.right, size, apply))
    if isinstance(tree, ast.Compare) and len(tree.ops) == 1 and type(tree.ops[0]) in _COMPARISON:
        return apply(_COMPARISON[type(tree.ops[0])], _evaluate(tree.left, size, apply),
                     _evaluate(tree.comparators[0], size, apply))
    raise _Unreadable(ast.unparse(tree))


def check_export_guards(ep: torch.export.ExportedProgram, names: Optional[Sequence[str]] = None) -> List[str]:
    """Asserts in `ep`'s graph each guard of its code that its symbols'
    ranges do not already imply (module docstring); returns each in words,
    the inputs named `names` (by default their placeholders' names). A
    guard this cannot read is warned of: served unchecked, a call can break
    it."""
    specs = [s for s in ep.graph_signature.input_specs if s.kind == InputKind.USER_INPUT]
    placeholders = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    inputs = [placeholders.get(getattr(s.arg, "name", None)) for s in specs]
    shown = [names[i] if names is not None else getattr(s.arg, "name", f"input {i}") for i, s in enumerate(specs)]

    def fake_size(i: int, d: int) -> Any:
        node = inputs[i] if i < len(inputs) else None
        value = node.meta.get("val") if node is not None else None
        if not isinstance(value, torch.Tensor) or d >= value.dim():
            raise _Unreadable(f"input {i}'s dimension {d}")
        return value.shape[d]

    def words(code: str) -> str:
        return _SIZE.sub(lambda m: f"{shown[int(m.group(1))]}.size({m.group(2)})", code)

    def node_size(i: int, d: int) -> Any:
        size = fake_size(i, d)
        return size if isinstance(size, int) else ep.graph.call_function(_aten.sym_size.int, (inputs[i], d))

    def emit(fn: Callable[..., Any], *args: Any) -> Any:
        if all(isinstance(a, int) for a in args):
            return fn(*args)
        return ep.graph.call_function(fn, args)

    # Each check goes before the graph's first op: before any kernel reads
    # the inputs.
    first_op = next(n for n in ep.graph.nodes if n.op != "placeholder")
    checks: List[str] = []
    for code in getattr(ep, "_guards_code", None) or []:
        try:
            tree = ast.parse(code, mode="eval")
            value = _evaluate(tree, fake_size, lambda fn, *args: fn(*args))
        except (_Unreadable, SyntaxError) as e:
            warnings.warn(
                f"precompile capture: torch.export guards the sizes with {words(code)!r}, which the "
                f"capture cannot read ({e}): a call that breaks it runs compiled code that assumes it",
                RuntimeWarning, stacklevel=2)
            continue
        if isinstance(value, torch.SymBool):
            expr = value.node.expr
            # From the symbols' ranges and equalities alone, which the
            # guards check: the other guards, this one among them, are not
            # facts here.
            static = value.node.shape_env._maybe_evaluate_static(expr, axioms=())
            if static is not None and bool(static):
                continue
        elif value:
            continue

        described = words(code)
        with ep.graph.inserting_before(first_op):
            condition = _evaluate(tree, node_size, emit)
            ep.graph.call_function(_aten._assert_scalar.default, (condition, f"shape guard: {described}"))
        checks.append(f"shape guard: {described}")
    if checks:
        ep.graph.lint()
        ep.graph_module.recompile()
    return checks
