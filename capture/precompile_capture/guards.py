"""Guards: when a captured variant is valid for a call.

Read off a strict torch.export program: per parameter in signature order, a
tensor's dtype, device type, rank and sizes (static, or a size symbol with a
range; dimensions sharing a symbol must be equal), the specialized value of a
non-tensor argument, relations between sizes that torch.export keeps only as
code (export_guards.py), and the global state the compiled code assumed. The
same guards are evaluated here in Python, so the capture dispatches exactly
as the runtime will.
"""

from __future__ import annotations

import dataclasses
import math
import operator
import re
import warnings
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Set, Tuple

import sympy
import torch
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols
from torch.export.graph_signature import InputKind, TensorArgument
from torch.utils._sympy.numbers import IntInfinity, int_oo
from torch.utils._sympy.value_ranges import ValueRanges as SizeRange

from .export_guards import COMPARE, SizeRelation, export_size_relations
from .index_fences import ArgumentPlace, fence_index, fence_strided_view
from .index_values import SAME_VALUES, ValueRanges, limits_within, placeholders_upstream
from .rewrites import UnservableGraph, rewrite_for_serving

DTYPE_NAMES = {
    torch.bool: "bool",
    torch.uint8: "uint8",
    torch.int8: "int8",
    torch.int16: "int16",
    torch.int32: "int32",
    torch.int64: "int64",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.float32: "float32",
    torch.float64: "float64",
}


@dataclasses.dataclass(frozen=True)
class Dim:
    static: Optional[int] = None
    symbol: Optional[int] = None
    # A dimension bound to a symbol is the symbol's value plus this (an
    # attention mask one longer than the cache it goes with).
    offset: int = 0

    def words(self) -> str:
        if self.offset == 0:
            return f"s{self.symbol}"
        return f"s{self.symbol}{self.offset:+d}"


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    dtype: torch.dtype
    device: str
    dims: Tuple[Dim, ...]


@dataclasses.dataclass(frozen=True)
class ArgGuard:
    parameter: int
    # Exactly one of: a tensor spec, None (`is_none`), or a specialized scalar.
    tensor: Optional[TensorSpec] = None
    is_none: bool = False
    has_value: bool = False
    value: Any = None


@dataclasses.dataclass(frozen=True)
class SymbolRange:
    symbol: int
    min: int
    max: Optional[int]
    name: str  # The exported program's name for it.


@dataclasses.dataclass(frozen=True)
class GuardSet:
    args: Tuple[ArgGuard, ...]
    symbols: Tuple[SymbolRange, ...]
    grad_enabled: bool
    default_dtype: torch.dtype
    # Integer tensor inputs the compiled code indexes a table with: parameter
    # -> [min, max) of the values it can take. Not a guard (no variant would
    # serve other values, and compiled code cannot report an index out of
    # range without ending the process): the runtime refuses such calls.
    index_ranges: Tuple[Tuple[int, int, int], ...] = ()
    # What the compiled code checks as it runs, in words: indices from the
    # inputs' values (index_fences.py); a run that fails may have failed one
    # of these, and the server says so.
    index_checks: Tuple[str, ...] = ()
    # Relations between the symbols' values, checked after every dimension.
    size_relations: Tuple[SizeRelation, ...] = ()
    # (symbol, its range's top) where the top is the exported program's own:
    # a guard of the model's code (a size computed from it taken as 1, say)
    # rather than a table's length or --max-size. For the capture's warnings
    # only: not saved, and not part of what the guards are.
    code_ceilings: Tuple[Tuple[int, int], ...] = dataclasses.field(default=(), compare=False)

    def holds(self, values: Sequence[Any]) -> bool:
        if torch.is_grad_enabled() != self.grad_enabled:
            return False
        if torch.get_default_dtype() != self.default_dtype:
            return False
        ranges = {s.symbol: s for s in self.symbols}
        bound: Dict[int, int] = {}
        for g in self.args:
            v = values[g.parameter]
            if g.is_none:
                if v is not None:
                    return False
            elif g.tensor is not None:
                t = g.tensor
                if not isinstance(v, torch.Tensor):
                    return False
                if v.dtype != t.dtype or v.device.type != t.device or v.dim() != len(t.dims):
                    return False
                for d, dim in enumerate(t.dims):
                    size = v.shape[d]
                    if dim.symbol is None:
                        if size != dim.static:
                            return False
                        continue
                    size -= dim.offset
                    if dim.symbol in bound:
                        if size != bound[dim.symbol]:
                            return False
                    else:
                        r = ranges[dim.symbol]
                        if size < r.min or (r.max is not None and size > r.max):
                            return False
                        bound[dim.symbol] = size
            elif not same_scalar(g.value, v):
                return False
        return all(relation_holds(relation, bound) for relation in self.size_relations)

    def describe(self, names: Sequence[str], device: str = "cpu") -> str:
        """The guards in words: `x: float32[s0 in [2, inf), 4], n == 0`."""
        ranges = {s.symbol: s for s in self.symbols}
        seen: set = set()
        parts = []
        for g in self.args:
            name = names[g.parameter]
            if g.is_none:
                parts.append(f"{name} is None")
            elif g.tensor is not None:
                dims = []
                for dim in g.tensor.dims:
                    if dim.symbol is None:
                        dims.append(str(dim.static))
                    elif dim.symbol in seen:
                        dims.append(dim.words())
                    else:
                        seen.add(dim.symbol)
                        r = ranges[dim.symbol]
                        upper = f"{r.max}]" if r.max is not None else "inf)"
                        # A dimension offset from its symbol says the symbol's
                        # range in parentheses, not as a dimension of its own.
                        dims.append(f"{dim.words()} (s{dim.symbol} in [{r.min}, {upper})"
                                    if dim.offset else f"s{dim.symbol} in [{r.min}, {upper}")
                where = "" if g.tensor.device == device else f" on {g.tensor.device}"
                parts.append(
                    f"{name}: {DTYPE_NAMES[g.tensor.dtype]}[{', '.join(dims)}]{where}"
                )
            else:
                parts.append(f"{name} == {g.value!r}")
        parts.extend(f"shape guard: {r.text}" for r in self.size_relations)
        return ", ".join(parts) if parts else "(no arguments)"


def same_scalar(expected: Any, actual: Any) -> bool:
    """The runtime's equality guard (runtime/guard_program.cc, the reference):
    the same kind (bool, int, float, str or None) and the same value, NaN
    equal to NaN. A float parameter's ints are floats by then
    (Frame.normalize), as the runtime converts them before its guards."""
    if type(expected) is not type(actual):
        return False
    if isinstance(expected, float) and math.isnan(expected):
        return math.isnan(actual)
    return expected == actual


class NotPlainSymbol(Exception):
    """Some dimensions are expressions of symbols, not plain symbols."""

    def __init__(self, dims: List[Tuple[int, int]]) -> None:
        super().__init__(f"dimensions {dims} are not plain size symbols")
        self.dims = dims


class GuardExtractionError(Exception):
    pass


def _int_bound(value: Any) -> Optional[int]:
    if isinstance(value, IntInfinity) or value in (sympy.oo, -sympy.oo):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _symbol_plus_constant(expr: sympy.Expr) -> Optional[Tuple[sympy.Symbol, int]]:
    """(s, c) for a size that is `s + c` (c may be 0); None for other expressions."""
    if isinstance(expr, sympy.Symbol):
        return expr, 0
    if isinstance(expr, sympy.Add) and len(expr.args) == 2:
        constants = [a for a in expr.args if a.is_Integer]
        symbols = [a for a in expr.args if isinstance(a, sympy.Symbol)]
        if len(constants) == 1 and len(symbols) == 1:
            return symbols[0], int(constants[0])
    return None


def extract_guards(ep: torch.export.ExportedProgram, values: Sequence[Any],
                   names: Optional[Sequence[str]] = None) -> Tuple[GuardSet, List[int]]:
    """The guards of `ep`, captured from a call with `values` (signature order)
    to parameters `names` (by default the exported program's input names;
    used in the index checks' descriptions).

    Returns the guard set and the parameters whose tensors the compiled program
    takes, in order. Raises NotPlainSymbol when a size is an expression.
    Indices the guards cannot keep within their tables are fenced in `ep`'s
    graph (`_index_limits`), and ops whose compiled form would not serve
    what eager computes are rewritten there (rewrites.py); the graph is then
    compiled as it is.
    """
    try:
        if rewrite_for_serving(ep.graph):
            ep.graph.lint()
            ep.graph_module.recompile()
    except UnservableGraph as e:
        raise GuardExtractionError(str(e)) from e
    user_specs = [s for s in ep.graph_signature.input_specs if s.kind == InputKind.USER_INPUT]
    if len(user_specs) != len(values):
        raise GuardExtractionError(
            f"the exported program has {len(user_specs)} user inputs for {len(values)} arguments"
        )
    placeholders = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    related = _related_symbols(ep)
    # Per class of related symbols (keyed by its root): its id, and the
    # input symbols in it.
    symbol_ids: Dict[sympy.Symbol, int] = {}
    members: Dict[sympy.Symbol, List[sympy.Symbol]] = {}
    not_plain: List[Tuple[int, int]] = []
    args: List[ArgGuard] = []
    tensor_inputs: List[int] = []
    for i, (spec, value) in enumerate(zip(user_specs, values)):
        if isinstance(spec.arg, TensorArgument):
            if not isinstance(value, torch.Tensor):
                raise GuardExtractionError(f"argument {i} is a tensor input but got {type(value)}")
            fake = placeholders[spec.arg.name].meta["val"]
            dims: List[Dim] = []
            for d, size in enumerate(fake.shape):
                if isinstance(size, int):
                    dims.append(Dim(static=size))
                    continue
                expr = size.node.expr
                if expr.is_Integer:
                    dims.append(Dim(static=int(expr)))
                elif _symbol_plus_constant(expr) is not None:
                    # Symbols the program relates without a guard share one id.
                    symbol, offset = _symbol_plus_constant(expr)
                    root = related(symbol)
                    sid = symbol_ids.setdefault(root, len(symbol_ids))
                    members.setdefault(root, []).append(symbol)
                    dims.append(Dim(symbol=sid, offset=offset))
                else:
                    not_plain.append((i, d))
                    dims.append(Dim(static=int(value.shape[d])))
            args.append(
                ArgGuard(
                    parameter=i,
                    tensor=TensorSpec(dtype=value.dtype, device=value.device.type, dims=tuple(dims)),
                )
            )
            tensor_inputs.append(i)
        elif value is None:
            args.append(ArgGuard(parameter=i, is_none=True))
        elif isinstance(value, torch.Tensor):
            raise GuardExtractionError(f"tensor argument {i} became a constant in the exported program")
        else:
            args.append(ArgGuard(parameter=i, has_value=True, value=value))
    if not_plain:
        raise NotPlainSymbol(not_plain)
    inputs = {spec.arg.name: i for i, spec in enumerate(user_specs) if isinstance(spec.arg, TensorArgument)}
    index_ranges, symbol_limits, index_checks = _index_limits(ep, inputs, related, values, names)
    symbols = []
    code_ceilings: List[Tuple[int, int]] = []
    # Each input symbol's range as the guards check it.
    checked: Dict[sympy.Symbol, SizeRange] = {}
    for root, sid in symbol_ids.items():
        # The intersection of the ranges of the class's input symbols.
        lower: Optional[int] = None
        upper: Optional[int] = None
        code_upper: Optional[int] = None
        exported: List[str] = []
        for sym in dict.fromkeys(members[root]):
            exported.append(str(sym))
            vr = ep.range_constraints.get(sym)
            lo = _int_bound(vr.lower) if vr is not None else None
            hi = _int_bound(vr.upper) if vr is not None else None
            if hi is not None:
                code_upper = hi if code_upper is None else min(code_upper, hi)
            if sym in symbol_limits:
                hi = symbol_limits[sym] if hi is None else min(hi, symbol_limits[sym])
            if lo is not None:
                lower = lo if lower is None else max(lower, lo)
            if hi is not None:
                upper = hi if upper is None else min(upper, hi)
        lower = lower if lower is not None else 0
        if upper is not None and upper < lower:
            raise GuardExtractionError(
                f"size symbols {', '.join(exported)} must be equal but their ranges do not meet"
            )
        symbols.append(SymbolRange(symbol=sid, min=lower, max=upper, name="=".join(exported)))
        if upper is not None and upper == code_upper:
            code_ceilings.append((sid, upper))
        for sym in members[root]:
            checked[sym] = SizeRange(lower, upper if upper is not None else int_oo)
    ids = _symbol_ids(symbols)
    relations = export_size_relations(ep, lambda expr: size_program(expr, ids), names, checked)
    guards = GuardSet(
        args=tuple(args),
        symbols=tuple(symbols),
        grad_enabled=torch.is_grad_enabled(),
        default_dtype=torch.get_default_dtype(),
        index_ranges=tuple((i, lo, hi) for i, (lo, hi) in sorted(index_ranges.items())),
        index_checks=tuple(index_checks),
        size_relations=tuple(relations),
        code_ceilings=tuple(code_ceilings),
    )
    return guards, tensor_inputs


_aten = torch.ops.aten


def _size_expr(arg: Any) -> Optional[sympy.Expr]:
    """The expression of a size the graph computed (sym_size and arithmetic on it)."""
    val = arg.meta.get("val") if isinstance(arg, torch.fx.Node) else None
    return val.node.expr if isinstance(val, torch.SymInt) else None


def _index_source(node: Any) -> Optional[Tuple[str, Any, int]]:
    """Where the values of an index tensor come from, up to an added offset (a
    constant, or for an arange an expression of sizes): ("input", placeholder,
    offset) or ("arange", end, offset) (arange from 0)."""
    offset = 0
    while isinstance(node, torch.fx.Node):
        if node.op == "placeholder":
            return ("input", node, offset)
        if node.op != "call_function":
            return None
        target, args = node.target, node.args
        if target in SAME_VALUES:
            node = args[0]
        elif target in (_aten.add.Tensor, _aten.add.Scalar) and isinstance(args[1], int) and not isinstance(args[1], bool):
            offset += args[1]
            node = args[0]
        elif target is _aten.add.Tensor and (size := _size_expr(args[1])) is not None:
            # A size added (positions after a cache's length).
            offset = size + offset
            node = args[0]
        elif target is _aten.arange.default and len(args) == 1:
            return ("arange", args[0], offset)
        elif target is _aten.arange.start and len(args) == 2 and isinstance(args[0], int) and args[0] >= 0:
            return ("arange", args[1], offset)
        elif target is _aten.arange.start and len(args) == 2 and _size_expr(args[0]) is not None:
            # arange(s, s + n): n positions after a cache of length s.
            start = _size_expr(args[0])
            end = _size_expr(args[1]) if isinstance(args[1], torch.fx.Node) else args[1]
            length = sympy.simplify(end - start) if end is not None else None
            if length is None or not length.is_Integer or int(length) < 0:
                return None
            return ("arange", int(length), start + offset)
        else:
            return None
    return None


# Ops that index a dimension of their first argument with index tensors,
# whose compiled code checks the indices and, past the dimension, throws
# inside an OpenMP region (which ends the process) or, on CUDA, fails a
# device-side assert (which poisons the context).
_SCATTER_GATHER = {
    _aten.gather.default, _aten.scatter.src, _aten.scatter.value, _aten.scatter.reduce,
    _aten.scatter.value_reduce, _aten.scatter_add.default, _aten.scatter_reduce.two,
}
_INDEX_PUTS = {_aten.index_put.default, _aten._unsafe_index_put.default, _aten._index_put_impl.default}
_INDEX_LISTS = {_aten.index.Tensor, _aten._unsafe_index.Tensor} | _INDEX_PUTS
# Ops whose index tensor, at position 2, indexes dimension args[1] of their
# first argument, as index_select's does; and whether a negative index counts
# from the end.
_INDEX_ALONG_DIM = {
    _aten.index_add.default: False, _aten.index_copy.default: False,
    _aten.index_fill.int_Scalar: True, _aten.index_fill.int_Tensor: True,
    _aten.index_reduce.default: False,
}
# Losses whose integer targets (argument 1) are classes: indices into the
# classes' dimension of their input (argument 0), which become a gather only
# inside Inductor; and the argument that holds the class the loss skips.
_CLASS_TARGET_LOSSES = {
    _aten.cross_entropy_loss.default: 4, _aten.nll_loss_nd.default: 4, _aten.nll_loss.default: 4,
    _aten.nll_loss_forward.default: 4, _aten.nll_loss2d_forward.default: 4,
    _aten.multi_margin_loss.default: None,
}
_IGNORE_INDEX_DEFAULT = -100


class IndexedDim(NamedTuple):
    """One index tensor of an indexing op, and the dimension it indexes."""

    size: Any  # The dimension's size (int or SymInt); None where unknown.
    index: Any  # The index tensor's node.
    negative: bool  # Whether negative indices count from the end.
    table: Any  # The indexed tensor's node.
    dim: Optional[int]  # None: the table's elements, counted flat (take).
    place: ArgumentPlace  # Where the op takes the index tensor.
    ignored: Optional[int] = None  # A value taken besides: a loss's ignore_index.
    ignored_is: str = "its ignore_index"  # What that value means, in words.
    # Where the indexed elements are not the table's: the sizes (ints or the
    # graph's size nodes) whose product counts them (max_unpool's indices,
    # flat into each plane of its output).
    flat_sizes: Optional[Tuple[Any, ...]] = None


def _out_of_place(target: Any) -> Any:
    """The op an in-place op does in place (index_put_ for index_put): the
    exported graph keeps `t[i] = v` and `t.index_copy_(...)` as they were
    written, and they index as the out-of-place ops do."""
    if not isinstance(target, torch._ops.OpOverload) or not target._schema.is_mutable:
        return target
    name = target._schema.name.split("::")[-1]
    if not name.endswith("_") or name.endswith("__"):
        return target
    packet = getattr(_aten, name[:-1], None)
    return getattr(packet, target._overloadname, target) if packet is not None else target


def _indexed_dimensions(node: Any) -> List[IndexedDim]:
    """Each index tensor of an indexing op, in place or not."""

    def size(table: Any, dim: Any) -> Any:
        t = table.meta.get("val") if isinstance(table, torch.fx.Node) else None
        if not isinstance(t, torch.Tensor) or not isinstance(dim, int):
            return None
        if not -t.dim() <= dim < t.dim():
            return None
        return t.shape[dim]

    target, args = _out_of_place(node.target), node.args
    if target is _aten.embedding.default:
        return [IndexedDim(size(args[0], 0), args[1], False, args[0], 0, 1)]
    if target in (_aten.embedding_bag.default, _aten.embedding_bag.padding_idx, _aten._embedding_bag.default):
        return [IndexedDim(size(args[0], 0), args[1], False, args[0], 0, 1)]
    if target is _aten.index_select.default or target in _SCATTER_GATHER:
        return [IndexedDim(size(args[0], args[1]), args[2], False, args[0], args[1], 2)]
    if target in _INDEX_ALONG_DIM:
        return [IndexedDim(size(args[0], args[1]), args[2], _INDEX_ALONG_DIM[target], args[0], args[1], 2)]
    if target in (_aten.take.default, _aten.put.default):
        t = args[0].meta.get("val") if isinstance(args[0], torch.fx.Node) else None
        elements = t.numel() if isinstance(t, torch.Tensor) else None
        return [IndexedDim(elements, args[1], True, args[0], None, 1)]
    if target in _CLASS_TARGET_LOSSES and isinstance(args[1], torch.fx.Node) and _is_integer_input(args[1]):
        t = args[0].meta.get("val") if isinstance(args[0], torch.fx.Node) else None
        if not isinstance(t, torch.Tensor):
            return []
        classes = t.dim() - 1 if target is _aten.multi_margin_loss.default else min(1, t.dim() - 1)
        ignore_at = _CLASS_TARGET_LOSSES[target]
        ignored = None
        if ignore_at is not None:
            ignored = args[ignore_at] if len(args) > ignore_at else node.kwargs.get(
                "ignore_index", _IGNORE_INDEX_DEFAULT)
        return [IndexedDim(size(args[0], classes), args[1], False, args[0], classes, 1, ignored)]
    if target is _aten.multilabel_margin_loss.default and isinstance(args[1], torch.fx.Node) \
            and _is_integer_input(args[1]):
        # Each row's target classes, up to a -1 that ends them.
        t = args[0].meta.get("val") if isinstance(args[0], torch.fx.Node) else None
        if not isinstance(t, torch.Tensor):
            return []
        classes = t.dim() - 1
        return [IndexedDim(size(args[0], classes), args[1], False, args[0], classes, 1, -1,
                           "the end of its targets")]
    if target in (_aten.max_unpool2d.default, _aten.max_unpool3d.default) \
            and isinstance(args[1], torch.fx.Node) and _is_integer_input(args[1]):
        # Each index is a position in its plane of the output, counted flat.
        sizes = tuple(args[2])
        known_sizes = [s if isinstance(s, int) else s.meta.get("val") if isinstance(s, torch.fx.Node) else None
                       for s in sizes]
        if any(s is None for s in known_sizes):
            return []
        return [IndexedDim(math.prod(known_sizes), args[1], False, args[0], None, 1, flat_sizes=sizes)]
    if target is _aten.one_hot.default and len(args) > 1 and isinstance(args[1], int) and args[1] > 0:
        # Classes: compiled, a class past them gave a row of zeros where
        # eager refuses the call.
        return [IndexedDim(args[1], args[0], False, args[0], None, 0, flat_sizes=(args[1],))]
    if target in _INDEX_LISTS:
        # Negative indices count from the end, as in Python. A boolean (or
        # uint8) mask indexes as many dimensions as it has, at positions
        # within them by construction: not an index to check.
        indexed, d = [], 0
        for place, index in enumerate(args[1]):
            t = index.meta.get("val") if isinstance(index, torch.fx.Node) else None
            if isinstance(t, torch.Tensor) and t.dtype in (torch.bool, torch.uint8):
                d += t.dim()
                continue
            if isinstance(index, torch.fx.Node):
                indexed.append(IndexedDim(size(args[0], d), index, True, args[0], d, (1, place)))
            d += 1
        return indexed
    return []


def _is_integer_input(node: Any) -> bool:
    t = node.meta.get("val")
    return (isinstance(t, torch.Tensor) and not t.is_floating_point() and not t.is_complex()
            and t.dtype is not torch.bool)


def _program_tensors(ep: torch.export.ExportedProgram) -> Dict[str, torch.Tensor]:
    """The program's own tensors (buffers, constants) by placeholder name."""
    tensors: Dict[str, torch.Tensor] = {}
    for spec in ep.graph_signature.input_specs:
        if spec.kind in (InputKind.BUFFER, InputKind.CONSTANT_TENSOR) and isinstance(spec.arg, TensorArgument):
            t = ep.state_dict.get(spec.target)
            if t is None:
                t = ep.constants.get(spec.target)
            if isinstance(t, torch.Tensor):
                tensors[spec.arg.name] = t
    return tensors


def _input_symbols(ep: torch.export.ExportedProgram, inputs: Dict[str, int],
                   values: Sequence[Any]) -> Dict[sympy.Symbol, int]:
    """Each size symbol of an input, and its size in the example call."""
    symbols: Dict[sympy.Symbol, int] = {}
    for node in ep.graph.nodes:
        t = node.meta.get("val") if node.op == "placeholder" and node.name in inputs else None
        if not isinstance(t, torch.Tensor):
            continue
        for d, s in enumerate(t.shape):
            if isinstance(s, torch.SymInt) and isinstance(s.node.expr, sympy.Symbol):
                symbols[s.node.expr] = int(values[inputs[node.name]].shape[d])
    return symbols


def _index_limits(
    ep: torch.export.ExportedProgram, inputs: Dict[str, int], related: Callable[[sympy.Symbol], sympy.Symbol],
    values: Sequence[Any], names: Optional[Sequence[str]] = None,
) -> Tuple[Dict[int, Tuple[int, int]], Dict[sympy.Symbol, int], List[str]]:
    """What indexing a table requires of the inputs.

    Returns the value range [min, max) of each integer input (by parameter)
    used as indices into a dimension of static size (an embedding's rows;
    index, index_select, gather, scatter, index_put, take, index_add, index_copy,
    index_fill, embedding_bag, one_hot), and the largest size of
    each symbol that is the length of an arange used so (position ids), of a
    cache that such an arange's positions follow, or of a dimension that
    bounds indices the graph computes (RoBERTa's position ids count the
    tokens that are not padding: index_values.py): compiled code that reads
    past a table ends the process, so these become refusals instead.

    Indices computed from an integer input's values are fenced by a range
    for those values, checked by the server as an index input's is: the
    range a mask takes, [0, 1], if every example call's values were in it
    and it bounds the indices (OPT's positions count a mask's ones, which
    served a mask of 5s would read past the table); else the values the
    example calls showed, if that bounds them. `values` are the example
    call's, in signature order. Indices no range bounds, and indices into a
    dimension of dynamic size that they may pass (unless the guards make
    the two sizes one: `related`), are checked at run time instead: such an
    op is fenced in `ep`'s graph (index_fences.py), and the capture warns of
    it. A loss's class targets, which may also be its ignore_index, get no
    range of an input's values: they are proved from the sizes or fenced.
    The third value describes each fence, naming `names` (the parameters),
    and the checks the exported program itself makes of values it reads
    from the inputs.
    """
    ranges: Dict[int, Tuple[int, int]] = {}
    limits: Dict[sympy.Symbol, int] = {}
    fences: List[Tuple[torch.fx.Node, IndexedDim]] = []
    # What a client knows the tensors by: the parameters, the model's own
    # tensors by their names in it, without the capture's wrapper of the
    # frame's module (compiling.py); the graph's other nodes have no name.
    known = {p: names[i] if names is not None else p for p, i in inputs.items()}
    known.update((spec.arg.name, spec.target.removeprefix("frame_module."))
                 for spec in ep.graph_signature.input_specs
                 if spec.kind != InputKind.USER_INPUT and isinstance(spec.arg, TensorArgument) and spec.target)

    def describe(node: torch.fx.Node, indexed: IndexedDim) -> str:
        """The op's indices in words: the inputs they come from, the table."""
        size = "a size the capture does not know" if indexed.size is None else indexed.size
        into = f"the {size} elements" if indexed.dim is None else f"dimension {indexed.dim} ({size})"
        table = known.get(indexed.table.name)
        if node.target is _aten.one_hot.default:
            into, table = f"its {size} classes", None
        elif indexed.flat_sizes is not None:
            into, table = f"each plane of its output ({size} elements)", None
        sources = sorted(known[p] for p in placeholders_upstream(indexed.index) & inputs.keys())
        if indexed.ignored is not None:
            return (f"{node.target}'s class targets{' from ' + ', '.join(sources) if sources else ''}: "
                    f"indices into {into} of {table or 'its input'}, or {indexed.ignored} ({indexed.ignored_is})")
        return (f"{node.target}'s indices{' from ' + ', '.join(sources) if sources else ''} into {into}"
                f"{' of ' + table if table else ''}")

    # The program's own checks of values it reads from the inputs (narrow
    # at s.item(): "u0 <= 8"): a call that breaks one fails the run, as a
    # fenced index does. Listed before the fences add theirs.
    checks = _value_assertions(ep, inputs, known)
    program_tensors = _program_tensors(ep)
    computed = ValueRanges(program_tensors)
    integer_inputs = {n.name for n in ep.graph.nodes
                      if n.op == "placeholder" and n.name in inputs and _is_integer_input(n)}
    input_symbols = _input_symbols(ep, inputs, values)
    # Sizes the guards require equal, as one symbol (the class's root).
    roots = {s: related(s) for s in input_symbols}

    def as_roots(e: Any) -> Any:
        return e.xreplace(roots) if isinstance(e, sympy.Basic) else e

    def limit(symbol: sympy.Symbol, largest: int) -> None:
        limits[symbol] = min(limits.get(symbol, largest), largest)

    def narrow(parameter: int, lo: int, hi: int) -> None:
        """Input `parameter`'s values within [lo, hi) too."""
        if parameter in ranges:
            lo, hi = max(lo, ranges[parameter][0]), min(hi, ranges[parameter][1])
        ranges[parameter] = (lo, hi)

    def within(r: Optional[Tuple[Any, Any]], size: Any, negative: bool) -> Optional[Dict[sympy.Symbol, int]]:
        if r is None or size is None:
            return None
        found = limits_within((as_roots(r[0]), as_roots(r[1])), -size if negative else 0, size,
                              set(roots.values()))
        # A range is an over-estimate: limits that would refuse the example
        # call itself (whose indices were in range: it ran) prove nothing.
        if found is not None and any(input_symbols[s] > found[roots[s]]
                                     for s in input_symbols if roots[s] in found):
            return None
        return found

    def assumptions(index: torch.fx.Node) -> List[Dict[str, Tuple[sympy.Integer, sympy.Integer]]]:
        """Ranges to try for the integer inputs `index` is computed from: a
        mask's [0, 1], then what the example call showed."""
        names = sorted(placeholders_upstream(index) & integer_inputs)
        seen = {}
        for name in names:
            value = values[inputs[name]]
            if not isinstance(value, torch.Tensor) or value.numel() == 0:
                return []
            seen[name] = (int(value.min()), int(value.max()))
        if not seen:
            return []
        candidates = []
        if all(0 <= lo and hi <= 1 for lo, hi in seen.values()):
            candidates.append({name: (sympy.Integer(0), sympy.Integer(1)) for name in seen})
        candidates.append({name: (sympy.Integer(lo), sympy.Integer(hi)) for name, (lo, hi) in seen.items()})
        return candidates

    for node in ep.graph.nodes:
        if node.op != "call_function":
            continue
        for indexed in _indexed_dimensions(node):
            rows, index, negative = indexed.size, indexed.index, indexed.negative
            # A range of an input's values cannot say "or the ignore_index":
            # a loss's targets are proved from the sizes or fenced.
            takes_ignored = indexed.ignored is not None
            source = _index_source(index) if isinstance(rows, int) and not takes_ignored else None
            if source is not None:
                kind, origin, offset = source
                if isinstance(offset, sympy.Expr) and not offset.is_Integer:
                    # arange(n) + (s + c), n static: positions that follow a cache of length s.
                    shifted = _symbol_plus_constant(offset)
                    if kind == "arange" and isinstance(origin, int) and shifted is not None:
                        symbol, c = shifted
                        limit(symbol, rows - origin - c)
                        continue
                elif kind == "input" and origin.name in inputs and _is_integer_input(origin):
                    offset = int(offset)
                    narrow(inputs[origin.name], (-rows if negative else 0) - offset, rows - offset)
                    continue
                elif kind == "arange" and isinstance(origin, torch.fx.Node):
                    end = origin.meta.get("val")
                    expr = end.node.expr if isinstance(end, torch.SymInt) else None
                    if isinstance(expr, sympy.Symbol):
                        limit(expr, rows - int(offset))
                        continue
            # Indices the graph computed: fenced where their range follows
            # from the sizes.
            size = None if rows is None else as_roots(
                sympy.sympify(rows.node.expr if isinstance(rows, torch.SymInt) else rows))
            found = within(computed.of(index), size, negative)
            if found is None and not takes_ignored:
                # From an input's values: fenced by a range for those values.
                for assumed in assumptions(index):
                    found = within(ValueRanges(program_tensors, assumed).of(index), size, negative)
                    if found is not None:
                        for name, (lo, hi) in assumed.items():
                            narrow(inputs[name], int(lo), int(hi) + 1)
                        break
            if found is None:
                fenced = size is not None
                if fenced:
                    fences.append((node, indexed))
                warnings.warn(
                    f"precompile capture: {describe(node, indexed)}: values the capture cannot prove "
                    "within the dimension (an input's values or values computed from them, "
                    "or sizes it cannot relate to that one): " + (
                        "the compiled code checks them before the op reads them, and a call that takes "
                        "them outside fails" if fenced else
                        "a call that takes them outside ends the serving process"),
                    RuntimeWarning, stacklevel=2)
                continue
            for root, largest in found.items():
                for symbol in input_symbols:
                    if roots[symbol] == root:
                        limit(symbol, largest)
    for node, indexed in fences:
        what = describe(node, indexed)
        fence_index(ep.graph, node, indexed.place, indexed.table, indexed.dim, indexed.negative, what,
                    indexed.ignored, indexed.flat_sizes)
        checks.append(what)
    strided = _fenced_strided_views(ep, inputs, known)
    checks.extend(strided)
    if fences or strided:
        ep.graph.lint()
        ep.graph_module.recompile()
    return ranges, limits, checks


def _fenced_strided_views(ep: torch.export.ExportedProgram, inputs: Dict[str, int],
                          known: Dict[str, str]) -> List[str]:
    """Fences each view whose layout comes from values the graph reads
    (index_fences.py, `fence_strided_view`): compiled code takes it as given
    (a stride of s.item() = 1e8 read far past the base). Returns the checks
    in words, naming the inputs the layout comes from."""
    checks = []
    for node in list(ep.graph.nodes):
        if node.op != "call_function" or node.target is not _aten.as_strided.default:
            continue
        layout = [a for arg in node.args[1:] for a in (arg if isinstance(arg, (list, tuple)) else [arg])
                  if isinstance(a, torch.fx.Node)]
        if not any(free_unbacked_symbols(a.meta.get("val")) for a in layout):
            continue
        sources = sorted(known[p] for a in layout for p in placeholders_upstream(a) & inputs.keys())
        base = known.get(node.args[0].name, "its input")
        what = (f"{node.target}'s sizes and strides from {', '.join(dict.fromkeys(sources))}: "
                f"a view within the elements of {base}")
        fence_strided_view(ep.graph, node, what)
        warnings.warn(f"precompile capture: {what}: the compiled code checks the view before it is read, "
                      "and a call that takes it outside fails", RuntimeWarning, stacklevel=3)
        checks.append(what)
    return checks


_ASSERTION_PREFIX = "Runtime assertion failed for expression "
_LISTED_ASSERTIONS = 4


def _value_assertions(ep: torch.export.ExportedProgram, inputs: Dict[str, int],
                      known: Dict[str, str]) -> List[str]:
    """The exported program's runtime assertions about values it reads from
    the inputs (`.item()`, data-dependent sizes), in words: one line naming
    the inputs, `u0` said as `s.item()` where it is read straight from one."""
    read_as: Dict[str, str] = {}
    # The inputs whose values become sizes or scalars: upstream of an op
    # whose result has unbacked symbols that its arguments do not.
    read: Set[str] = set()
    for node in ep.graph.nodes:
        if node.op != "call_function" or not free_unbacked_symbols(node.meta.get("val")) or any(
                free_unbacked_symbols(a.meta.get("val")) for a in node.all_input_nodes):
            continue
        read |= placeholders_upstream(node) & inputs.keys()
        if (node.target in (_aten.item.default, _aten._local_scalar_dense.default)
                and node.args[0].name in inputs and isinstance(node.meta["val"], torch.SymInt)):
            read_as[str(node.meta["val"].node.expr)] = f"{known[node.args[0].name]}.item()"
    sources: Set[str] = set()
    expressions: List[str] = []
    for node in ep.graph.nodes:
        if node.op != "call_function" or node.target is not _aten._assert_scalar.default:
            continue
        upstream = placeholders_upstream(node.args[0]) & read
        if not upstream:
            continue
        sources |= upstream
        message = str(node.args[1]) if len(node.args) > 1 else ""
        expression = message.removeprefix(_ASSERTION_PREFIX).split(" on node ")[0]
        expressions.append(re.sub(r"\bu\d+\b", lambda m: read_as.get(m.group(0), m.group(0)), expression))
    if not expressions:
        return []
    expressions = list(dict.fromkeys(expressions))
    listed = "; ".join(expressions[:_LISTED_ASSERTIONS])
    if len(expressions) > _LISTED_ASSERTIONS:
        listed += f"; and {len(expressions) - _LISTED_ASSERTIONS} more"
    return [f"what the program requires of values it reads from {', '.join(sorted(known[p] for p in sources))}: "
            f"{listed}"]


# Ops that broadcast their tensor inputs to their output's shape, beyond
# those tagged pointwise; and ops that index a tensor (the tensor, then the
# index tensors by dimension).
_BROADCASTING = {
    _aten.expand.default, _aten.expand_copy.default, _aten.copy.default,
    _aten.__and__.Tensor, _aten.__or__.Tensor, _aten.__xor__.Tensor,
    _aten.__lshift__.Tensor, _aten.__rshift__.Tensor, _aten.masked_fill.Tensor,
}
_INDEXING = {_aten.index.Tensor, _aten._unsafe_index.Tensor, _aten.index_select.default}


def _plain_symbol(size: Any) -> Optional[sympy.Symbol]:
    if isinstance(size, torch.SymInt) and isinstance(size.node.expr, sympy.Symbol):
        return size.node.expr
    return None


def _related_symbols(ep: torch.export.ExportedProgram) -> Callable[[sympy.Symbol], sympy.Symbol]:
    """Size symbols the exported program needs equal but torch.export left
    distinct, as the root of each one's class (union-find over the graph).

    torch.export relates two sizes by a guard (then they are one symbol) only
    where it checks them. Two ways it does not, whose compiled code then reads
    out of bounds or throws inside an OpenMP region, which ends the process:

    - broadcasting (a pointwise op, expand): two distinct symbols aligned
      against each other (right-aligned), or a dimension's symbol against
      the output's, can only be equal at run time (a symbol's range excludes
      1 once export has specialized 0 and 1); a static dimension, 1 included,
      relates nothing;
    - indexing a dimension of size s_a with arange(s_b) (through views,
      unsqueeze, slice, expand): the indices need s_b <= s_a, required here
      as s_b == s_a. Hugging Face's attention masks index the mask's batch
      dimension with arange of input_ids' batch size (masking_utils), so the
      mask's batch symbol is otherwise never related to input_ids'.
    - putting values at indices (index_put, `t[i] = v`): the values are read
      as broadcast to what the indices select, aligned as broadcasting is;
      index_copy and index_add read one slice of their source per index
      (transformers' StaticCache copies the new keys to the client's
      cache_position so), the source otherwise shaped as the table.
    In-place ops (index_put_, index_copy_), which the exported graph keeps
    as the model wrote them, relate what their out-of-place forms do.
    """
    parent: Dict[sympy.Symbol, sympy.Symbol] = {}

    def find(s: sympy.Symbol) -> sympy.Symbol:
        root = s
        while parent.get(root, root) != root:
            root = parent[root]
        while s != root:
            parent[s], s = root, parent.get(s, s)
        return root

    def union(a: Optional[sympy.Symbol], b: Optional[sympy.Symbol]) -> None:
        if a is None or b is None:
            return
        ra, rb = find(a), find(b)
        if ra != rb:
            # Deterministic: the symbol with the smaller name is the root.
            if str(rb) < str(ra):
                ra, rb = rb, ra
            parent[rb] = ra

    def val(arg: Any) -> Any:
        return arg.meta.get("val") if isinstance(arg, torch.fx.Node) else None

    def align(a: Sequence[Any], b: Sequence[Any]) -> None:
        """Right-aligned, as broadcasting aligns them."""
        for k in range(1, min(len(a), len(b)) + 1):
            union(_plain_symbol(a[-k]), _plain_symbol(b[-k]))

    def put_shape(table: torch.Tensor, indices: Sequence[Any]) -> Optional[List[Any]]:
        """The shape of table[indices] (advanced indexing, None for a whole
        dimension): the index tensors' broadcast shape in place of the
        dimensions they index, or in front where they are apart. None for
        a mask (its shape is its values')."""
        placed = [(d, val(i)) for d, i in enumerate(indices) if i is not None]
        if not placed or any(not isinstance(t, torch.Tensor) or t.dtype is torch.bool for _, t in placed):
            return None
        longest = max((t for _, t in placed), key=lambda t: t.dim())
        for _, t in placed:
            align(t.shape, longest.shape)
        broadcast = [next((t.shape[-k] for _, t in placed if t.dim() >= k and t.shape[-k] != 1), 1)
                     for k in range(longest.dim(), 0, -1)]
        dims = [d for d, _ in placed]
        if dims == list(range(dims[0], dims[-1] + 1)):
            return list(table.shape[:dims[0]]) + broadcast + list(table.shape[dims[-1] + 1:])
        return broadcast + [n for d, n in enumerate(table.shape) if d not in dims]

    for node in ep.graph.nodes:
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        target = _out_of_place(node.target)
        if target in _INDEX_PUTS:
            # The values are read as broadcast to what the indices select.
            table, values = val(node.args[0]), val(node.args[2])
            if isinstance(table, torch.Tensor) and isinstance(values, torch.Tensor):
                selected = put_shape(table, node.args[1])
                if selected is not None:
                    align(values.shape, selected)
        elif target in (_aten.index_copy.default, _aten.index_add.default):
            # One slice of the source per index, the source otherwise the
            # table's shape: each slice is read at its index's position.
            table, index, source = val(node.args[0]), val(node.args[2]), val(node.args[3])
            if (isinstance(table, torch.Tensor) and isinstance(index, torch.Tensor)
                    and isinstance(source, torch.Tensor) and source.dim() == table.dim() > 0):
                along = node.args[1] % table.dim()
                for d in range(table.dim()):
                    if d != along:
                        union(_plain_symbol(source.shape[d]), _plain_symbol(table.shape[d]))
                    elif index.dim() == 1:
                        union(_plain_symbol(source.shape[d]), _plain_symbol(index.shape[0]))
        elif target in _INDEXING:
            for indexed in _indexed_dimensions(node):
                size, index = indexed.size, indexed.index
                source = _index_source(index)
                # Only arange(end) from 0: with an offset, equality would
                # not be what the indices need.
                if source is None or source[0] != "arange" or source[2] != 0:
                    continue
                union(_plain_symbol(size), _plain_symbol(val(source[1])))
        elif target in _BROADCASTING or torch.Tag.pointwise in target.tags:
            out = val(node)
            if not isinstance(out, torch.Tensor):
                continue
            for arg in list(node.args) + list(node.kwargs.values()):
                t = val(arg)
                if not isinstance(t, torch.Tensor) or t.dim() > out.dim():
                    continue
                for k in range(1, t.dim() + 1):
                    union(_plain_symbol(t.shape[-k]), _plain_symbol(out.shape[-k]))
    return find


# One step of a SizeProgram (proto/artifact.proto): ("constant", value),
# ("symbol", guard symbol id) or ("op", name of SizeProgram.Op).
SizeStep = Tuple[str, Any]


def _symbol_ids(symbols: Sequence[SymbolRange]) -> Dict[str, int]:
    """The export's name of each symbol -> the guard symbol that stands for
    it: a guard symbol's name joins them ("s6=s27", see extract_guards)."""
    return {name: r.symbol for r in symbols for name in r.name.split("=")}


# Where a size program's arithmetic leaves 64 bits, the runtime's evaluation
# (runtime/size_program.cc) fails it.
_INT64_MAX = 2**63 - 1
# SizeProgram.Op's names -> what they compute, as Python's floor division and
# modulo do (the runtime's).
_SIZE_OPS: Dict[str, Callable[[int, int], int]] = {
    "ADD": operator.add, "MUL": operator.mul, "FLOOR_DIV": operator.floordiv,
    "MOD": operator.mod, "MAX": max, "MIN": min,
}


def relation_holds(relation: SizeRelation, symbols: Dict[int, int]) -> bool:
    """Whether `relation` holds for the symbols' values; not where either
    side's value is not known (evaluate_size_program)."""
    left = evaluate_size_program(relation.left, symbols)
    right = evaluate_size_program(relation.right, symbols)
    return left is not None and right is not None and COMPARE[relation.comparison](left, right)


def evaluate_size_program(steps: Sequence[SizeStep], symbols: Dict[int, int]) -> Optional[int]:
    """A size program's value (of any sign) given the symbols' values; None
    where the runtime's is not known: a symbol without a value, a division by
    zero, a value past 64 bits, a malformed program."""
    stack: List[int] = []
    for kind, value in steps:
        if kind == "constant":
            stack.append(value)
            continue
        if kind == "symbol":
            if value not in symbols:
                return None
            stack.append(symbols[value])
            continue
        if len(stack) < 2:
            return None
        b, a = stack.pop(), stack.pop()
        if value in ("FLOOR_DIV", "MOD") and b == 0:
            return None
        result = _SIZE_OPS[value](a, b)
        if abs(result) > _INT64_MAX:
            return None
        stack.append(result)
    return stack[0] if len(stack) == 1 else None


def size_program(expr: sympy.Expr, ids: Dict[str, int]) -> Optional[List[SizeStep]]:
    """`expr`, an integer expression of size symbols, as a postfix program
    over the guards' symbol ids; None when it uses what a program cannot say
    (a symbol the guards do not bind, a fraction, a float function)."""
    from torch.utils._sympy import functions as F

    steps: List[SizeStep] = []

    def fold(args, op) -> bool:
        if not emit(args[0]):
            return False
        for a in args[1:]:
            if not emit(a):
                return False
            steps.append(("op", op))
        return True

    def emit(e) -> bool:
        if e.is_Integer:
            steps.append(("constant", int(e)))
            return True
        if e.is_Symbol:
            if str(e) not in ids:
                return False
            steps.append(("symbol", ids[str(e)]))
            return True
        if isinstance(e, sympy.Add):
            return fold(e.args, "ADD")
        if isinstance(e, sympy.Mul):
            return fold(e.args, "MUL")
        if isinstance(e, (sympy.Max, F.Max)):
            return fold(e.args, "MAX")
        if isinstance(e, (sympy.Min, F.Min)):
            return fold(e.args, "MIN")
        if isinstance(e, F.FloorDiv):
            return fold(e.args, "FLOOR_DIV")
        if isinstance(e, (F.PythonMod, F.Mod, sympy.Mod)):
            return fold(e.args, "MOD")
        if isinstance(e, F.CeilDiv):  # -((-a) // b)
            a, b = e.args
            if not emit(a):
                return False
            steps.extend([("constant", -1), ("op", "MUL")])
            if not emit(b):
                return False
            steps.extend([("op", "FLOOR_DIV"), ("constant", -1), ("op", "MUL")])
            return True
        if isinstance(e, F.ModularIndexing):  # (x // div) % mod
            if not fold(e.args[:2], "FLOOR_DIV") or not emit(e.args[2]):
                return False
            steps.append(("op", "MOD"))
            return True
        if isinstance(e, (sympy.Pow, F.PowByNatural)):
            base, exponent = e.args
            if not exponent.is_Integer or not 1 <= int(exponent) <= 8:
                return False
            return fold([base] * int(exponent), "MUL")
        if isinstance(e, F.Identity):
            return emit(e.args[0])
        return False

    return steps if emit(expr) else None


def output_specs(
    ep: torch.export.ExportedProgram, guards: GuardSet
) -> List[Tuple[torch.dtype, List[int], List[int], List[Optional[List[SizeStep]]]]]:
    """(dtype, shape, symbols, programs) of each output tensor: -1 in
    `shape` for a dimension that is symbolic; in `symbols`, the guards'
    symbol id that such a dimension equals, or -1 (static, or an expression
    of symbols); in `programs`, such an expression as a size program
    (size_program), or None."""
    ids = _symbol_ids(guards.symbols)
    nodes = {n.name: n for n in ep.graph.nodes}
    specs = []
    for s in ep.graph_signature.output_specs:
        if s.kind.name != "USER_OUTPUT" or not isinstance(s.arg, TensorArgument):
            continue
        fake = nodes[s.arg.name].meta["val"]
        shape, symbols, programs = [], [], []
        for size in fake.shape:
            program = None
            if isinstance(size, int):
                shape.append(size)
                symbols.append(-1)
            elif size.node.expr.is_Integer:
                shape.append(int(size.node.expr))
                symbols.append(-1)
            else:
                shape.append(-1)
                symbol = ids.get(str(size.node.expr), -1)
                symbols.append(symbol)
                if symbol < 0:
                    program = size_program(size.node.expr, ids)
            programs.append(program)
        specs.append((fake.dtype, shape, symbols, programs))
    return specs
