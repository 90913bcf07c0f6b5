"""Indices the capture cannot prove within their table, checked at run time.

Compiled code checks an indirect index where the op reads it: on the CPU,
AOTInductor's check throws inside an OpenMP region, which ends the process
(pytorch/pytorch#195402); on CUDA it fails a device-side assert, which
poisons the CUDA context for every later call. guards.py bounds what it can
from the sizes and from the inputs' values, and the server refuses a call
outside those bounds before any code runs. What it cannot bound (indices
computed from a floating-point input's values, T5's logarithmic position
buckets) is fenced here, in the exported graph before it is compiled:

    within = (index >= low) & (index < size)    low: -size where negative
                                                indices count from the end;
             | (index == ignore_index)          a loss's targets: the class
                                                whose rows it skips
    _assert_scalar(within.all().item())         the wrapper's check, outside
                                                every kernel: an exception the
                                                AOTInductor runner returns as
                                                a failed run
    op(..., where(within, index, 0), ...)       a kernel that runs before the
                                                check reads row 0, never past
                                                the table

A call whose indices are within computes what it computed before; one
outside fails as a call, and the process serves on. The cost is a reduction
over the indices per fenced op and reading one value, which on CUDA waits
for the device.
"""

from __future__ import annotations

import operator
from typing import Any, Optional, Sequence, Tuple, Union

import torch

_aten = torch.ops.aten

# Where an op takes an index tensor: its argument's position, or the
# position of a list argument and the index within it.
ArgumentPlace = Union[int, Tuple[int, int]]


def fence_index(graph: torch.fx.Graph, op: torch.fx.Node, place: ArgumentPlace, table: torch.fx.Node,
                dim: Optional[int], negative: bool, what: str, ignored: Optional[int] = None,
                flat_sizes: Optional[Sequence[Any]] = None) -> None:
    """Rewrites `op` so that the index tensor at `place` is checked against
    dimension `dim` of `table` (None: its elements, counted flat) before use
    (module docstring); `ignored` is a value the op takes besides (a loss's
    ignore_index, whose rows it skips); `flat_sizes`, where given, are the
    sizes (ints or size nodes) whose product the index stays below instead.
    `what` says in the failed run's message what was out of range."""
    index = op.args[place] if isinstance(place, int) else op.args[place[0]][place[1]]
    with graph.inserting_before(op):
        size: Any
        if flat_sizes is not None:
            size = 1
            for factor in flat_sizes:
                size = size * factor if isinstance(size, int) and isinstance(factor, int) else \
                    graph.call_function(operator.mul, (size, factor))
        else:
            val = table.meta["val"]
            size = val.numel() if dim is None else val.shape[dim]
            if not isinstance(size, int):
                size = (graph.call_function(_aten.sym_numel.default, (table,)) if dim is None else
                        graph.call_function(_aten.sym_size.int, (table, dim)))
        if not negative:
            low: Any = 0
        elif isinstance(size, int):
            low = -size
        else:
            low = graph.call_function(operator.neg, (size,))
        within = graph.call_function(
            _aten.logical_and.default,
            (graph.call_function(_aten.ge.Scalar, (index, low)),
             graph.call_function(_aten.lt.Scalar, (index, size))))
        if ignored is not None:
            within = graph.call_function(
                _aten.logical_or.default, (within, graph.call_function(_aten.eq.Scalar, (index, ignored))))
        every = graph.call_function(_aten._local_scalar_dense.default,
                                    (graph.call_function(_aten.all.default, (within,)),))
        graph.call_function(_aten._assert_scalar.default, (every, what))
        safe = graph.call_function(_aten.where.ScalarOther, (within, index, 0))
    args = list(op.args)
    if isinstance(place, int):
        args[place] = safe
    else:
        indices = list(args[place[0]])
        indices[place[1]] = safe
        args[place[0]] = indices
    op.args = tuple(args)


def fence_strided_view(graph: torch.fx.Graph, op: torch.fx.Node, what: str) -> None:
    """Checks, before `op` (as_strided), that the view it takes stays within
    its base's elements: sizes and strides not negative, and the last
    element it reaches, offset + sum((size - 1) * stride), before the
    base's count. For a layout computed from values the graph reads
    (`s.item()`); the check is on the same symbols, so the compiled code
    makes it as soon as they are read, before any kernel reads the view.
    A base that is itself a view of a larger storage may hold a valid view
    this refuses."""
    base, sizes, strides = op.args[0], list(op.args[1]), list(op.args[2])
    offset = op.args[3] if len(op.args) > 3 and op.args[3] is not None else 0

    def apply(f: Any, a: Any, b: Any) -> Any:
        if not isinstance(a, torch.fx.Node) and not isinstance(b, torch.fx.Node):
            return f(a, b)
        return graph.call_function(f, (a, b))

    def check(condition: Any) -> None:
        if isinstance(condition, torch.fx.Node):
            graph.call_function(_aten._assert_scalar.default, (condition, what))

    with graph.inserting_before(op):
        count = base.meta["val"].numel()
        if not isinstance(count, int):
            count = graph.call_function(_aten.sym_numel.default, (base,))
        last = offset
        check(apply(operator.ge, offset, 0))
        for size, stride in zip(sizes, strides):
            check(apply(operator.ge, size, 0))
            check(apply(operator.ge, stride, 0))
            last = apply(operator.add, last, apply(operator.mul, apply(operator.sub, size, 1), stride))
        check(apply(operator.lt, last, count))
