"""Guards torch.export keeps only as code, as relations between sizes.

An exported program's shape guards that are not a symbol's range or two
sizes being one (which the capture's dimension guards express: guards.py)
survive only in `ExportedProgram._guards_code`, Python that `ep.module()`
runs before each call and that AOTInductor's package never runs: a product
of sizes against another (a token classifier's logits.view(-1, C) against
labels.view(-1)), a divisibility (a reshape into heads), the side of a
branch on a product of sizes. Compiled code given a call that breaks one
reads past its buffers or computes the other branch's answer.

Each such guard becomes one of the variant's guards (a SizeRelation of
proto/artifact.proto: two size programs and a comparison), checked with the
others before the variant is chosen: a call that breaks it misses the
variant, as Dynamo's guards would have it, and the server looks for another
variant, runs a flagged frame eagerly, or refuses it naming the guard.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import operator
import re
import warnings
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import sympy
import torch
from torch.export.graph_signature import InputKind
from torch.utils._sympy.value_ranges import ValueRanges, bound_sympy

_SIZE = re.compile(r"L\['flat_args'\]\[(\d+)\]\.size\(\)\[(\d+)\]")
_ARITHMETIC: Dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
}
# max() and min() of sizes (a pooling's output size with ceil_mode, the
# product of clamped sizes): torch's symbolic forms, which size programs
# write as MAX and MIN.
_EXTREMA: Dict[str, Callable[[Any, Any], Any]] = {"max": torch.sym_max, "min": torch.sym_min}
_COMPARISON: Dict[type, Callable[[Any, Any], Any]] = {
    ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
    ast.Gt: operator.gt, ast.GtE: operator.ge,
}
# sympy's relation -> SizeRelation.Comparison's name, and what it computes.
_RELATIONS: Dict[type, Tuple[str, Callable[[int, int], bool]]] = {
    sympy.Eq: ("EQ", operator.eq), sympy.Ne: ("NE", operator.ne),
    sympy.StrictLessThan: ("LT", operator.lt), sympy.LessThan: ("LE", operator.le),
    sympy.StrictGreaterThan: ("GT", operator.gt), sympy.GreaterThan: ("GE", operator.ge),
}
COMPARE: Dict[str, Callable[[int, int], bool]] = dict(_RELATIONS.values())
# The most values a side may hold at once (runtime/size_program.h,
# kMaxSizeProgramDepth): the server refuses to load a deeper one.
_MAX_DEPTH = 16
# Guards the capture cannot read that it warns of one by one, and how much of
# each it shows.
_WARNED_EACH = 3
_MAX_SHOWN = 400


def _depth(steps: Sequence[Tuple[str, Any]]) -> int:
    depth = deepest = 0
    for kind, _ in steps:
        depth += -1 if kind == "op" else 1
        deepest = max(deepest, depth)
    return deepest


@dataclasses.dataclass(frozen=True)
class SizeRelation:
    """`left comparison right`, each side a size program (guards.SizeStep)
    over the guards' symbol ids; `text` says it with the inputs' names."""
    left: Tuple[Tuple[str, Any], ...]
    comparison: str
    right: Tuple[Tuple[str, Any], ...]
    text: str


class _Unreadable(Exception):
    pass


def _evaluate(tree: ast.AST, size: Callable[[int, int], Any]) -> Any:
    """A guard's value, sizes from `size`."""
    if isinstance(tree, ast.Expression):
        return _evaluate(tree.body, size)
    if isinstance(tree, ast.Constant) and isinstance(tree.value, int) and not isinstance(tree.value, bool):
        return tree.value
    if isinstance(tree, ast.Subscript):
        match = _SIZE.fullmatch(ast.unparse(tree))
        if match is None:
            raise _Unreadable(ast.unparse(tree))
        return size(int(match.group(1)), int(match.group(2)))
    if isinstance(tree, ast.UnaryOp) and isinstance(tree.op, ast.USub):
        return -_evaluate(tree.operand, size)
    if isinstance(tree, ast.BinOp) and type(tree.op) in _ARITHMETIC:
        return _ARITHMETIC[type(tree.op)](_evaluate(tree.left, size), _evaluate(tree.right, size))
    if (isinstance(tree, ast.Call) and isinstance(tree.func, ast.Name) and tree.func.id in _EXTREMA
            and len(tree.args) >= 2 and not tree.keywords):
        values = [_evaluate(arg, size) for arg in tree.args]
        return functools.reduce(_EXTREMA[tree.func.id], values)
    if (isinstance(tree, ast.Call) and ast.unparse(tree.func) == "math.ceil" and len(tree.args) == 1
            and not tree.keywords and isinstance(tree.args[0], ast.BinOp) and isinstance(tree.args[0].op, ast.Div)):
        # ceil(a / b) of integers, b > 0, as the floor division size
        # programs have: (a + b - 1) // b (pooling's and patching's counts).
        a, b = _evaluate(tree.args[0].left, size), _evaluate(tree.args[0].right, size)
        if not isinstance(b, int) or b <= 0:
            raise _Unreadable(ast.unparse(tree))
        return (a + (b - 1)) // b
    if isinstance(tree, ast.Compare) and len(tree.ops) == 1 and type(tree.ops[0]) in _COMPARISON:
        return _COMPARISON[type(tree.ops[0])](_evaluate(tree.left, size), _evaluate(tree.comparators[0], size))
    if isinstance(tree, ast.BoolOp) and isinstance(tree.op, ast.Or):
        # A relation per guard has no "or": one whose symbols' ranges imply
        # it is none, the rest stay unreadable (export_size_relations).
        return functools.reduce(operator.or_, (_as_bool(_evaluate(v, size)) for v in tree.values))
    raise _Unreadable(ast.unparse(tree))


def _as_bool(value: Any) -> Any:
    return value if isinstance(value, (bool, torch.SymBool)) else bool(value)


def _conjuncts(code: str, tree: ast.AST) -> List[Tuple[str, ast.AST]]:
    """`code` (parsed: `tree`) split at its top-level "and"s: each part, as
    written and parsed, a guard."""
    body = tree.body if isinstance(tree, ast.Expression) else tree
    if isinstance(body, ast.BoolOp) and isinstance(body.op, ast.And):
        return [part for value in body.values for part in _conjuncts(code, value)]
    return [(ast.get_source_segment(code, body) or ast.unparse(body), body)]


def export_size_relations(
    ep: torch.export.ExportedProgram,
    program: Callable[[sympy.Expr], Optional[List[Tuple[str, Any]]]],
    names: Optional[Sequence[str]] = None,
    ranges: Optional[Dict[sympy.Symbol, ValueRanges]] = None,
) -> List[SizeRelation]:
    """Each guard of `ep`'s code that its symbols' ranges and equalities do
    not already imply, as a relation whose sides `program` writes as size
    programs; the inputs named `names` (by default their placeholders'
    names). `ranges`: the ranges the other guards check of the input
    symbols, under which a guard that always holds is none. A guard this
    cannot read is warned of: served unchecked, a call can break it."""
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

    unread: List[Tuple[str, str]] = []

    def unreadable(code: str, why: str) -> None:
        unread.append((code, why))

    guards: List[Tuple[str, ast.AST]] = []
    for whole in getattr(ep, "_guards_code", None) or []:
        try:
            guards.extend(_conjuncts(whole, ast.parse(whole, mode="eval")))
        except SyntaxError as e:
            unreadable(whole, str(e))
    relations: List[SizeRelation] = []
    for code, tree in guards:
        try:
            value = _evaluate(tree, fake_size)
        except _Unreadable as e:
            unreadable(code, str(e))
            continue
        if not isinstance(value, torch.SymBool):
            if value:
                continue
            # False at the sizes the capture traced with: no call passes it.
            unreadable(code, "it does not hold for the example call")
            continue
        expr = value.node.expr
        # From the symbols' ranges and equalities alone, which the guards
        # check: the other guards, this one among them, are not facts here.
        static = value.node.shape_env._maybe_evaluate_static(expr, axioms=())
        if static is not None and bool(static):
            continue
        if ranges is not None:
            bound = bound_sympy(expr, ranges)
            if bound.is_singleton() and bool(bound.lower):
                continue
        relation = _RELATIONS.get(type(expr))
        left = program(expr.lhs) if relation else None
        right = program(expr.rhs) if relation else None
        if relation is None or left is None or right is None:
            unreadable(code, f"as {expr}")
            continue
        if max(_depth(left), _depth(right)) > _MAX_DEPTH:
            unreadable(code, f"nested deeper than the server evaluates: {expr}")
            continue
        relations.append(SizeRelation(tuple(left), relation[0], tuple(right), words(code)))
    _warn_unread(unread, words)
    return relations


def _shortened(text: str) -> str:
    return text if len(text) <= _MAX_SHOWN else f"{text[:_MAX_SHOWN]}... ({len(text)} characters)"


def _warn_unread(unread: Sequence[Tuple[str, str]], words: Callable[[str], str]) -> None:
    """Warns of the guards the capture cannot read: the first few each, the
    rest in one warning. A model whose sizes each layer computes from the
    last (convolutions padded "same") has guards that grow with its depth,
    dozens of them, each thousands of characters long."""
    for code, why in unread[:_WARNED_EACH]:
        warnings.warn(
            f"precompile capture: torch.export guards the sizes with {_shortened(words(code))!r}, which "
            f"the capture cannot read ({_shortened(why)}): a call that breaks it runs compiled code that "
            "assumes it", RuntimeWarning, stacklevel=3)
    rest = unread[_WARNED_EACH:]
    if not rest:
        return
    sizes = sorted({words(m.group(0)) for code, _ in rest for m in _SIZE.finditer(code)})
    warnings.warn(
        f"precompile capture: torch.export keeps {len(rest)} more guards of the sizes that the capture "
        f"cannot read (of {', '.join(sizes) or 'no input size'}): calls that break them run compiled code "
        "that assumes them. Guards that grow with a model's depth come from sizes each layer computes from "
        "the last (convolutions padded \"same\"): a size the clients do not vary is better captured fixed, "
        "with example calls that all have it", RuntimeWarning, stacklevel=3)
