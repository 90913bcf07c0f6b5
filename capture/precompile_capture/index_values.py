"""The values an integer tensor of an exported graph can take.

Compiled code that indexes past a table ends the process (AOTInductor's CPU
bounds check throws inside an OpenMP region), so the capture fences every
index it can. Indices that are inputs are checked by the server against the
table (guards.py, `_index_source`). Indices the graph computes have a range
that often follows from the sizes alone: a comparison gives 0 or 1, a cumsum
of those counts up to the dimension's length, an arange ends at its length.
RoBERTa's position ids (transformers' create_position_ids_from_input_ids) are
`cumsum(ids != pad) * (ids != pad) + pad`: at most the sequence length plus
the pad index, so a sequence two shorter than the position table is the
longest its compiled code can take. `value_range` computes such ranges as
expressions of the size symbols, and `limits_within` turns "the range fits the
table" into the largest size each symbol may take.

Ranges are inclusive `(lo, hi)` sympy expressions and over-approximate: every
value the tensor can hold lies within. An op this module does not know, and
an input's values (the server checks those where they index a table), have
no range (None).
"""

from __future__ import annotations

import operator
from typing import Any, Dict, Optional, Set, Tuple

import sympy
import torch

Range = Tuple[sympy.Expr, sympy.Expr]

_aten = torch.ops.aten

# Ops whose output holds only values of their first argument.
SAME_VALUES = {
    _aten.view.default, _aten.reshape.default, _aten._unsafe_view.default, _aten.unsqueeze.default,
    _aten.squeeze.dim, _aten.squeeze.dims, _aten.squeeze.default, _aten.expand.default,
    _aten.clone.default, _aten.alias.default, _aten.flatten.using_ints, _aten.permute.default,
    _aten.transpose.int, _aten.t.default, _aten.slice.Tensor, _aten.select.int,
    _aten.contiguous.default, _aten.detach.default, _aten.lift_fresh_copy.default,
    _aten.repeat.default, _aten.flip.default, _aten.roll.default,
    # Values of a tensor picked by indices: still its values.
    _aten.index_select.default, _aten.gather.default, _aten.index.Tensor, _aten._unsafe_index.Tensor,
}
# Conversions: the values of the first argument, in another dtype.
_CONVERSIONS = {
    _aten.to.dtype, _aten.to.dtype_layout, _aten.to.device, _aten.to.other, _aten._to_copy.default,
    _aten.type_as.default,
}
_ADD = {_aten.add.Tensor, _aten.add.Scalar}
_SUB = {_aten.sub.Tensor, _aten.sub.Scalar, _aten.rsub.Scalar, _aten.rsub.Tensor}
_MUL = {_aten.mul.Tensor, _aten.mul.Scalar}
_CUMULATIVE = {_aten.cumsum.default}
_SUMS = {_aten.sum.dim_IntList, _aten.sum.default}
_ARG_REDUCTIONS = {_aten.argmax.default, _aten.argmin.default}
_FILLS = {_aten.full.default, _aten.full_like.default, _aten.scalar_tensor.default}
_ONES = {_aten.ones.default, _aten.ones_like.default}
_ZEROS = {_aten.zeros.default, _aten.zeros_like.default}
_CLAMPS = {_aten.clamp.default, _aten.clamp_min.default, _aten.clamp_max.default}
_UNIONS = {_aten.where.self, _aten.maximum.default, _aten.minimum.default}
_MASKED_FILL = {_aten.masked_fill.Scalar}
# Ops returning (values, indices along a dimension): the dimension's
# position among the arguments (None: keyword only) and its default.
_WITH_INDICES = {
    _aten.topk.default: (2, -1), _aten.sort.default: (1, -1), _aten.sort.stable: (None, -1),
    _aten.max.dim: (1, None), _aten.min.dim: (1, None),
}

# Booleans need no entry: a node of dtype bool is 0 or 1 whatever makes it.
_INT_DTYPES = {
    torch.uint8: (0, 2**8 - 1),
    torch.int8: (-(2**7), 2**7 - 1),
    torch.int16: (-(2**15), 2**15 - 1),
    torch.int32: (-(2**31), 2**31 - 1),
    torch.int64: (-(2**63), 2**63 - 1),
}
# Integers a float32 holds exactly: a range within them survives a round
# trip through floats.
_EXACT_IN_FLOAT = 2**24


def _val(node: Any) -> Any:
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else None


def _size(node: Any, dim: int) -> Optional[sympy.Expr]:
    t = _val(node)
    if not isinstance(t, torch.Tensor) or not isinstance(dim, int) or not -t.dim() <= dim < max(t.dim(), 1):
        return None
    if t.dim() == 0:
        return sympy.Integer(1)
    return sympy.sympify(t.shape[dim].node.expr if isinstance(t.shape[dim], torch.SymInt) else t.shape[dim])


def _dim_of(node: torch.fx.Node) -> Any:
    position, default = _WITH_INDICES[node.target]
    if position is not None and len(node.args) > position:
        return node.args[position]
    return node.kwargs.get("dim", default)


def _numel(node: Any) -> Optional[sympy.Expr]:
    t = _val(node)
    if not isinstance(t, torch.Tensor):
        return None
    n = sympy.Integer(1)
    for d in range(t.dim()):
        n = n * _size(node, d)
    return n


def _nonnegative(e: sympy.Expr) -> bool:
    return bool(sympy.simplify(e).is_nonnegative)


def _nonpositive(e: sympy.Expr) -> bool:
    return bool(sympy.simplify(e).is_nonpositive)


def _lower(a: sympy.Expr, b: sympy.Expr) -> sympy.Expr:
    """The smaller of two bounds, where it is known which; else their Min."""
    if _nonnegative(b - a):
        return a
    if _nonnegative(a - b):
        return b
    return sympy.Min(a, b)


def _upper(a: sympy.Expr, b: sympy.Expr) -> sympy.Expr:
    if _nonnegative(a - b):
        return a
    if _nonnegative(b - a):
        return b
    return sympy.Max(a, b)


def _within_dtype(r: Optional[Range], dtype: Any) -> Optional[Range]:
    """A range after a conversion to `dtype`; None where values could wrap
    or round."""
    if r is None:
        return None
    lo, hi = r
    if dtype in _INT_DTYPES:
        dlo, dhi = _INT_DTYPES[dtype]
        # Sizes are far below 2^31: a range of sizes fits every dtype from int32.
        if (lo.is_number and lo < dlo) or (hi.is_number and hi > dhi):
            return None
        if (not lo.is_number or not hi.is_number) and dlo > -(2**31):
            return None
        return r
    if isinstance(dtype, torch.dtype) and dtype.is_floating_point:
        if lo.is_number and hi.is_number and -_EXACT_IN_FLOAT <= lo and hi <= _EXACT_IN_FLOAT:
            return r
    return None


class ValueRanges:
    """Value ranges of one exported program's nodes, memoized.

    `constants` maps the names of placeholders that hold the program's own
    integer tensors (buffers, constants) to those tensors: their values are
    known. `inputs` maps input placeholders to the range their values are
    taken to lie in (the server checks them); other inputs' values are
    unknown.
    """

    def __init__(self, constants: Dict[str, torch.Tensor], inputs: Optional[Dict[str, Range]] = None):
        self._constants = constants
        self._inputs = inputs or {}
        self._memo: Dict[torch.fx.Node, Optional[Range]] = {}

    def of(self, arg: Any) -> Optional[Range]:
        if isinstance(arg, bool):
            return (sympy.Integer(int(arg)), sympy.Integer(int(arg)))
        if isinstance(arg, int):
            return (sympy.Integer(arg), sympy.Integer(arg))
        if isinstance(arg, float) and arg.is_integer() and abs(arg) <= _EXACT_IN_FLOAT:
            return (sympy.Integer(int(arg)), sympy.Integer(int(arg)))
        if not isinstance(arg, torch.fx.Node):
            return None
        if arg not in self._memo:
            self._memo[arg] = self._compute(arg)
        return self._memo[arg]

    def _compute(self, node: torch.fx.Node) -> Optional[Range]:
        val = _val(node)
        if isinstance(val, torch.SymInt):
            e = sympy.sympify(val.node.expr)
            return (e, e)
        if not isinstance(val, torch.Tensor):
            return None
        if val.dtype is torch.bool:
            return (sympy.Integer(0), sympy.Integer(1))
        r = self._compute_op(node)
        if r is None and val.dtype in (torch.uint8, torch.int8):
            lo, hi = _INT_DTYPES[val.dtype]
            return (sympy.Integer(lo), sympy.Integer(hi))
        return r

    def _compute_op(self, node: torch.fx.Node) -> Optional[Range]:
        if node.op == "placeholder":
            if node.name in self._inputs:
                return self._inputs[node.name]
            t = self._constants.get(node.name)
            if t is None or t.is_floating_point() or t.is_complex() or t.numel() == 0:
                return None
            return (sympy.Integer(int(t.min())), sympy.Integer(int(t.max())))
        if node.op != "call_function":
            return None
        target, args, kwargs = node.target, node.args, node.kwargs
        if target in SAME_VALUES:
            return self.of(args[0])
        if target in _CONVERSIONS:
            return _within_dtype(self.of(args[0]), _val(node).dtype)
        if target in _ADD or target in _SUB:
            a, b = self.of(args[0]), self.of(args[1])
            alpha = kwargs.get("alpha", 1)
            if a is None or b is None or not isinstance(alpha, int) or alpha < 0:
                return None
            if target in (_aten.rsub.Scalar, _aten.rsub.Tensor):
                a, b = b, a
            if target in _ADD:
                return (a[0] + alpha * b[0], a[1] + alpha * b[1])
            return (a[0] - alpha * b[1], a[1] - alpha * b[0])
        if target in _MUL:
            return _product(self.of(args[0]), self.of(args[1]))
        if target is _aten.neg.default:
            a = self.of(args[0])
            return None if a is None else (-a[1], -a[0])
        if target in _CUMULATIVE or target in _SUMS:
            a = self.of(args[0])
            if a is None:
                return None
            if target in _CUMULATIVE:
                n = _size(args[0], args[1])
            elif target is _aten.sum.default or not args[1]:
                n = _numel(args[0])
            else:
                n = sympy.Integer(1)
                for d in args[1]:
                    s = _size(args[0], d)
                    n = None if n is None or s is None else n * s
            if n is None:
                return None
            # Each sum adds at most n values: from n times the lowest (or 0,
            # if the values are not negative) to n times the highest.
            lo = sympy.Integer(0) if _nonnegative(a[0]) else n * a[0]
            hi = sympy.Integer(0) if _nonpositive(a[1]) else n * a[1]
            return (lo, hi)
        if target is _aten.arange.default:
            end = self.of(args[0])
            return None if end is None else (sympy.Integer(0), end[1] - 1)
        if target in (_aten.arange.start, _aten.arange.start_step):
            step = args[2] if len(args) > 2 else 1
            start, end = self.of(args[0]), self.of(args[1])
            if start is None or end is None or not isinstance(step, int) or step <= 0:
                return None
            return (start[0], end[1] - 1)
        if target in _FILLS:
            return self.of(args[1])
        if target in _ONES:
            return (sympy.Integer(1), sympy.Integer(1))
        if target in _ZEROS:
            return (sympy.Integer(0), sympy.Integer(0))
        if target in _ARG_REDUCTIONS:
            dim = args[1] if len(args) > 1 else kwargs.get("dim")
            n = _numel(args[0]) if dim is None else _size(args[0], dim)
            return None if n is None else (sympy.Integer(0), n - 1)
        if target is _aten.argsort.default:
            dim = args[1] if len(args) > 1 else kwargs.get("dim", -1)
            n = _size(args[0], dim)
            return None if n is None else (sympy.Integer(0), n - 1)
        if target is operator.getitem and _val(node).dtype is torch.int64:
            # The indices that topk, sort, max.dim and min.dim return.
            source = args[0]
            if isinstance(source, torch.fx.Node) and source.target in _WITH_INDICES and args[1] == 1:
                dim = _dim_of(source)
                n = _size(source.args[0], dim)
                return None if n is None else (sympy.Integer(0), n - 1)
            return None
        if target in _CLAMPS:
            return self._clamped(target, node)
        if target in _UNIONS or target in _MASKED_FILL:
            if target is _aten.where.self:
                a, b = self.of(args[1]), self.of(args[2])
            elif target in _MASKED_FILL:
                a, b = self.of(args[0]), self.of(args[2])
            else:
                a, b = self.of(args[0]), self.of(args[1])
            if a is None or b is None:
                return None
            if target is _aten.maximum.default:
                return (_upper(a[0], b[0]), _upper(a[1], b[1]))
            if target is _aten.minimum.default:
                return (_lower(a[0], b[0]), _lower(a[1], b[1]))
            return (_lower(a[0], b[0]), _upper(a[1], b[1]))
        if target is _aten.remainder.Scalar and isinstance(args[1], int) and args[1] > 0:
            return (sympy.Integer(0), sympy.Integer(args[1] - 1))
        return None

    def _clamped(self, target: Any, node: torch.fx.Node) -> Optional[Range]:
        args = list(node.args) + [None] * 3
        a = self.of(args[0])
        if target is _aten.clamp.default:
            low, high = args[1], args[2]
        elif target is _aten.clamp_min.default:
            low, high = args[1], None
        else:
            low, high = None, args[1]
        low_r = self.of(low) if low is not None else None
        high_r = self.of(high) if high is not None else None
        if (low is not None and low_r is None) or (high is not None and high_r is None):
            return None
        lo = a[0] if a is not None else None
        hi = a[1] if a is not None else None
        if low_r is not None:
            lo = low_r[0] if lo is None else _upper(lo, low_r[0])
            hi = None if hi is None else _upper(hi, low_r[0])
        if high_r is not None:
            hi = high_r[1] if hi is None else _lower(hi, high_r[1])
            lo = None if lo is None else _lower(lo, high_r[1])
        return None if lo is None or hi is None else (lo, hi)


def placeholders_upstream(node: torch.fx.Node) -> Set[str]:
    """The names of the placeholders `node`'s values are computed from."""
    names: Set[str] = set()
    seen: Set[torch.fx.Node] = set()
    stack = [node]
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        if n.op == "placeholder":
            names.add(n.name)
        stack.extend(n.all_input_nodes)
    return names


def _product(a: Optional[Range], b: Optional[Range]) -> Optional[Range]:
    if a is None or b is None:
        return None
    if _nonnegative(a[0]) and _nonnegative(b[0]):
        return (a[0] * b[0], a[1] * b[1])
    for x, y in ((a, b), (b, a)):
        if x[0] == x[1] and x[0].is_number:  # a constant factor
            c = x[0]
            return (c * y[0], c * y[1]) if c >= 0 else (c * y[1], c * y[0])
    return None


def limits_within(
    r: Range, low: sympy.Expr, rows: sympy.Expr, input_symbols: Set[sympy.Symbol]
) -> Optional[Dict[sympy.Symbol, int]]:
    """The largest size of each input size symbol under which every value in
    `r` lies in [low, rows) (`rows` a size: a number or an expression of
    symbols): {} when it always does, None when the capture cannot say (the
    range grows with something that is not an input's size, or in a way it
    cannot invert)."""

    def at_most(e: sympy.Expr, bound: sympy.Expr) -> Optional[Dict[sympy.Symbol, int]]:
        """The limits under which e <= bound; None if there are none."""
        e = sympy.expand(e)
        if isinstance(e, sympy.Max):
            merged: Dict[sympy.Symbol, int] = {}
            for x in e.args:
                found = at_most(x, bound)
                if found is None:
                    return None
                for s, largest in found.items():
                    merged[s] = min(merged.get(s, largest), largest)
            return merged
        if isinstance(e, sympy.Min):
            # One argument within the bound is enough: the one that needs
            # no limit if there is one.
            candidates = [found for found in (at_most(x, bound) for x in e.args) if found is not None]
            return min(candidates, key=len) if candidates else None
        if _nonpositive(e - bound):
            return {}
        if not bound.is_Integer or len(e.free_symbols) != 1:
            return None
        (s,) = e.free_symbols
        if s not in input_symbols or not e.is_polynomial(s):
            return None
        coefficients = sympy.Poly(e, s).all_coeffs()
        if len(coefficients) != 2 or not all(c.is_Integer for c in coefficients):
            return None
        a, c = (int(x) for x in coefficients)
        if a <= 0:
            return None
        return {s: (int(bound) - c) // a}

    def at_least(e: sympy.Expr, bound: sympy.Expr) -> bool:
        e = sympy.expand(e)
        if isinstance(e, sympy.Min):
            return all(at_least(x, bound) for x in e.args)
        if isinstance(e, sympy.Max):
            return any(at_least(x, bound) for x in e.args)
        # Sizes are positive: a range that grows with them stays above its
        # value at 0.
        return _nonnegative(e - bound)

    if not at_least(r[0], sympy.sympify(low)):
        return None
    return at_most(r[1], sympy.sympify(rows) - 1)
