"""Rewrites of the exported graph, before it is compiled, where Inductor's
code for an op would not serve what eager computes.

- A bilinear grid sampler with reflection padding: its compiled form can
  read past the image, which ends the serving process
  (`reflect_grids_before_sampling`).
- An embedding with `max_norm`: eager renormalizes the table's looked-up
  rows in place (`embedding_renorm_` on the detached weight), which
  torch.export keeps as a write to a constant; AOTInductor then returns the
  table as an output the server does not expect, and every call failed
  (`scale_renormed_rows`).

Each keeps the node it rewrites (its name, its value's metadata) so that the
exported program's signature still names the graph's outputs.
"""

from __future__ import annotations

from typing import Any, Dict, Set

import torch

_aten = torch.ops.aten


class UnservableGraph(Exception):
    """The graph does something its compiled form cannot serve as eager does."""


def rewrite_for_serving(graph: torch.fx.Graph) -> bool:
    """Every rewrite below; whether any changed the graph."""
    renormed = scale_renormed_rows(graph)
    reflected = reflect_grids_before_sampling(graph)
    return renormed or reflected


def _call(graph: torch.fx.Graph, target: Any, *args: Any) -> torch.fx.Node:
    return graph.call_function(target, args)


def scale_renormed_rows(graph: torch.fx.Graph) -> bool:
    """Replaces each in-place renorm of an embedding's table by scaling the
    rows it looks up: a row whose norm passes `max_norm` times
    `max_norm / (norm + 1e-7)`, eager's factor; returns whether it rewrote
    any.

    Eager renorms the same rows that F.embedding then looks up, so each
    call's output is the same; the table itself stays as captured (eager's
    keeps the rows it scaled, which changes no later lookup: a scaled row's
    norm no longer passes `max_norm`). A table that the graph uses after
    a renorm other than to look up rows a renorm scales (a tied output
    projection, which in eager sees the rows this call and earlier calls
    scaled) is refused: UnservableGraph.
    """
    renorms = [n for n in graph.nodes if n.op == "call_function" and n.target is _aten.embedding_renorm_.default]

    def table_of(renorm: torch.fx.Node) -> torch.fx.Node:
        table = renorm.args[0]
        return table.args[0] if table.op == "call_function" and table.target is _aten.detach.default else table

    def renorms_it(use: torch.fx.Node) -> bool:
        """Another renorm of the table, or the detached table it renorms."""
        return use.target is _aten.embedding_renorm_.default or (
            use.target is _aten.detach.default
            and all(u.target is _aten.embedding_renorm_.default for u in use.users))

    # Per table, the indices some renorm scales: a lookup of those rows is
    # rewritten by that renorm, whichever comes first.
    renormed: Dict[torch.fx.Node, Set[torch.fx.Node]] = {}
    for renorm in renorms:
        renormed.setdefault(table_of(renorm), set()).add(renorm.args[1])
    rewrote = False
    for renorm in renorms:
        order = {node: i for i, node in enumerate(graph.nodes)}
        detached, indices, max_norm, norm_type = renorm.args
        weight = table_of(renorm)
        after = [u for u in dict.fromkeys(list(weight.users) + list(detached.users))
                 if u is not renorm and u is not detached and order[u] > order[renorm] and not renorms_it(u)]
        lookups = [u for u in after if u.target is _aten.embedding.default and u.args[1] is indices]
        others = [u for u in after if u not in lookups
                  and not (u.target is _aten.embedding.default and u.args[1] in renormed[weight])]
        if others:
            raise UnservableGraph(
                f"an embedding's max_norm renormalizes its table '{weight.name}' in place, and the graph then "
                f"uses the table otherwise ({', '.join(sorted(str(u.target) for u in others))}): eager's answer "
                "depends on the rows earlier calls scaled, which a served program does not keep")
        for lookup in lookups:
            with graph.inserting_before(lookup):
                rows = graph.call_function(_aten.embedding.default, lookup.args, lookup.kwargs)
                norm = _call(graph, _aten.linalg_vector_norm.default, rows, norm_type, [-1], True)
                scale = _call(graph, _aten.div.Tensor, _call(graph, _aten.full_like.default, norm, max_norm),
                              _call(graph, _aten.add.Scalar, norm, 1e-7))
                factor = _call(graph, _aten.where.ScalarOther,
                               _call(graph, _aten.gt.Scalar, norm, max_norm), scale, 1.0)
            lookup.target, lookup.args, lookup.kwargs = _aten.mul.Tensor, (rows, factor), {}
        graph.erase_node(renorm)
        if detached is not weight and not detached.users:
            graph.erase_node(detached)
        rewrote = True
    return rewrote


_GRID_SAMPLERS = {_aten.grid_sampler.default, _aten.grid_sampler_2d.default}
_BILINEAR, _BORDER, _REFLECTION = 0, 1, 2


def reflect_grids_before_sampling(graph: torch.fx.Graph) -> bool:
    """Rewrites each bilinear 2-D grid sampler with reflection padding into
    one with border padding that samples the grid reflected into [-1, 1];
    returns whether it rewrote any.

    Inductor's bilinear sampler computes a reflected coordinate twice, in
    two kernels, with fmod, whose vectorized and scalar forms round
    differently: a grid value just past an odd integer (255.00001525878906)
    or above about 9e6 puts the two copies on either side of the image's
    edge, and the kernel that reads the image checks an index the other
    kernel's mask let through, which ends the process. Reflecting the grid
    beforehand with floor, division by 2 and subtraction, each exact or
    rounded the same in every kernel, leaves the sampler only border's clamp,
    whose copies agree. Both paddings fold the image's span, [-1, 1] in grid
    units whatever align_corners says, so the two are the same sampling; a
    grid within [-1, 1] is passed on untouched.
    """
    rewrote = False
    for op in list(graph.nodes):
        if (op.op != "call_function" or op.target not in _GRID_SAMPLERS or len(op.args) != 5
                or op.args[2] != _BILINEAR or op.args[3] != _REFLECTION
                or op.args[1].meta["val"].dim() != 4):
            continue
        grid = op.args[1]
        with graph.inserting_before(op):
            # Reflected about -1 first: the distance from -1 in spans of 2.
            distance = _call(graph, _aten.abs.default, _call(graph, _aten.add.Scalar, grid, 1))
            spans = _call(graph, _aten.floor.default, _call(graph, _aten.div.Scalar, distance, 2))
            into_span = _call(graph, _aten.sub.Tensor, distance, _call(graph, _aten.mul.Scalar, spans, 2))
            halves = _call(graph, _aten.floor.default, _call(graph, _aten.div.Scalar, spans, 2))
            even = _call(graph, _aten.eq.Tensor, spans, _call(graph, _aten.mul.Scalar, halves, 2))
            reflected = _call(graph, _aten.where.self, even, _call(graph, _aten.sub.Scalar, into_span, 1),
                             _call(graph, _aten.rsub.Scalar, into_span, 1))
            inside = _call(graph, _aten.le.Scalar, _call(graph, _aten.abs.default, grid), 1)
            folded = _call(graph, _aten.where.self, inside, grid, reflected)
        op.args = (op.args[0], folded, _BILINEAR, _BORDER, op.args[4])
        rewrote = True
    return rewrote

