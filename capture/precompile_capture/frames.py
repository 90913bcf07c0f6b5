"""Frames: the entry and the sub-frames a capture handles as units.

A frame is a module's `forward` (the entry module, or a sub-module named by its
path) or a plain function. Its inputs are its Python signature's parameters
(without `self`), then the entries the example calls pass through `*args`
("<args>.0", "<args>.1", ...) and `**kwargs` (by key), so that a signature as
real models write it (keyword-only parameters, defaults, `Optional[Tensor] =
None`, `**kwargs`) becomes a list of named inputs. Each has a kind (tensor,
optional tensor, int, float, bool, str) taken from its annotation or, when
there is none, from the first call that passes a value for it. What a frame
returns is an OutputSchema (outputs.py).

A parameter passed a structure of tensors (a transformers cache, a list or
dict of tensors: any pytree node) becomes one input per tensor leaf, named
by the parameter and the leaf's path as outputs are ("past_key_values.
key_cache.0"), so that a frame's outputs can come back as its inputs by
name; the structure is rebuilt from them before the frame's code runs. A
call that passes None for it passes None for each leaf.
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import types
import typing
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import torch.utils._pytree as pytree

import precompile_eager

from .errors import PrecompileError
from .guards import ArgGuard
from .outputs import OutputSchema, output_schema, path_words, register_known_structures
from .summary import FallbackCause


class Kind(enum.Enum):
    TENSOR = "TENSOR"
    INT = "INT"
    FLOAT = "FLOAT"
    BOOL = "BOOL"
    STRING = "STRING"
    OPTIONAL_TENSOR = "OPTIONAL_TENSOR"

    @property
    def is_tensor(self) -> bool:
        return self in (Kind.TENSOR, Kind.OPTIONAL_TENSOR)


# The dtypes the artifact format can name.
SUPPORTED_DTYPES = (
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
)

_ANNOTATION_KINDS = {
    torch.Tensor: Kind.TENSOR,
    int: Kind.INT,
    float: Kind.FLOAT,
    bool: Kind.BOOL,
    str: Kind.STRING,
}


class Binding(enum.Enum):
    """How a signature takes an input (mirrors artifact.proto's Parameter.Binding)."""

    POSITIONAL_OR_KEYWORD = "POSITIONAL_OR_KEYWORD"
    POSITIONAL_ONLY = "POSITIONAL_ONLY"
    KEYWORD_ONLY = "KEYWORD_ONLY"
    VAR_POSITIONAL = "VAR_POSITIONAL"
    VAR_KEYWORD = "VAR_KEYWORD"


# Each binding as the served eager program (precompile_eager) names it.
EAGER_BINDINGS = {
    Binding.POSITIONAL_ONLY: precompile_eager.POSITIONAL_ONLY,
    Binding.POSITIONAL_OR_KEYWORD: precompile_eager.POSITIONAL_OR_KEYWORD,
    Binding.KEYWORD_ONLY: precompile_eager.KEYWORD_ONLY,
    Binding.VAR_POSITIONAL: precompile_eager.VAR_POSITIONAL,
    Binding.VAR_KEYWORD: precompile_eager.VAR_KEYWORD,
}

_BINDINGS = {
    inspect.Parameter.POSITIONAL_OR_KEYWORD: Binding.POSITIONAL_OR_KEYWORD,
    inspect.Parameter.POSITIONAL_ONLY: Binding.POSITIONAL_ONLY,
    inspect.Parameter.KEYWORD_ONLY: Binding.KEYWORD_ONLY,
}


def _is_tensor_type(annotation: Any) -> bool:
    # torch.LongTensor and friends are not subclasses of torch.Tensor.
    return annotation is torch.Tensor or type(annotation).__name__ == "tensortype" or (
        isinstance(annotation, type) and issubclass(annotation, torch.Tensor)
    )


def _kind_of_annotation(annotation: Any) -> Tuple[Optional[Kind], bool]:
    """The kind an annotation names, and whether it admits None."""
    if annotation is inspect.Parameter.empty or annotation is None:
        return None, False
    if _is_tensor_type(annotation):
        return Kind.TENSOR, False
    if annotation in _ANNOTATION_KINDS:
        return _ANNOTATION_KINDS[annotation], False
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = typing.get_args(annotation)
        members = [a for a in args if a is not type(None)]
        optional = len(members) < len(args)
        if len(members) == 1:
            if _is_tensor_type(members[0]):
                return (Kind.OPTIONAL_TENSOR if optional else Kind.TENSOR), optional
            if members[0] in _ANNOTATION_KINDS:
                return _ANNOTATION_KINDS[members[0]], optional
    return None, False


def kind_of_value(value: Any) -> Optional[Kind]:
    """The kind a value suggests; None for None (it fits an optional tensor)."""
    if isinstance(value, torch.Tensor):
        return Kind.TENSOR
    if isinstance(value, bool):
        return Kind.BOOL
    if isinstance(value, int):
        return Kind.INT
    if isinstance(value, float):
        return Kind.FLOAT
    if isinstance(value, str):
        return Kind.STRING
    return None


@dataclasses.dataclass
class Param:
    name: str
    kind: Optional[Kind]  # None until annotated or observed.
    annotated: bool
    has_default: bool
    default: Any
    binding: Binding = Binding.POSITIONAL_OR_KEYWORD
    # The annotation admits None (Optional[int], Tensor | None).
    optional: bool = False
    example_dtype: Optional[torch.dtype] = None
    # The kind was guessed from a None: a later scalar may still decide it.
    none_guess: bool = False
    # Some call gave it a value other than its default.
    passed: bool = False
    # A leaf of a structure: the name of the frame's parameter it belongs to.
    tree: str = ""

    @property
    def keyword_only(self) -> bool:
        return self.binding in (Binding.KEYWORD_ONLY, Binding.VAR_KEYWORD)

    def final_kind(self) -> Kind:
        """The kind recorded in the artifact (a guess for a never-seen value)."""
        if self.kind is not None:
            return self.kind
        if self.has_default and self.default is None:
            return Kind.OPTIONAL_TENSOR
        if self.has_default:
            guessed = kind_of_value(self.default)
            if guessed is not None:
                return guessed
        return Kind.TENSOR


@dataclasses.dataclass
class Variant:
    index: int
    id: str
    package: str  # Path of the compiled .pt2 in the capture's work directory.
    guards: Any  # guards.GuardSet
    tensor_inputs: List[int]
    # Per value run() returns: whether it is a tensor (a leaf of the outputs).
    leaf_kinds: Tuple[bool, ...]
    # Tensor leaves: (dtype, shape with -1 dynamic, the symbol id of each
    # dynamic dimension or -1, the size program of each dimension that is an
    # expression of symbols or None); see guards.output_specs.
    outputs: List[Tuple[torch.dtype, List[int], List[int], List[Optional[list]]]]
    captured_from: str
    compile_seconds: float
    # The operators outside ATen its compiled code calls by name
    # (called_operators.package_operators).
    operators: Tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class FrameInfo:
    """A read-only view of one frame's capture state."""

    name: str
    is_entry: bool
    parameters: Tuple[Tuple[str, str], ...]  # (name, kind) pairs.
    outputs: Tuple[str, ...]  # The names of the tensors it returns.
    variants: Tuple[Tuple[str, str], ...]  # (id, guards in words) pairs.
    eager_fallback: bool
    fallback_cause: Optional[FallbackCause]
    fallback_detail: str
    fallback_exception: str  # Qualified name of the exception Dynamo gave up with.
    truncated: bool
    variantless_entry_fallback: bool
    compile_error: str
    calls: int


class Frame:
    """One frame and what the capture has recorded for it."""

    def __init__(
        self,
        name: str,
        *,
        is_entry: bool,
        module: Optional[torch.nn.Module] = None,
        module_path: str = "",
        function: Optional[Callable[..., Any]] = None,
    ) -> None:
        assert (module is None) != (function is None)
        self.name = name
        self.is_entry = is_entry
        self.module = module
        self.module_path = module_path
        self.function = function
        # The original Python code of the frame (unbound for a module).
        self.code: Callable[..., Any] = (
            type(module).forward if module is not None else function  # type: ignore[assignment]
        )
        what = f"frame '{name}'"
        target = module.forward if module is not None else function
        try:
            self.signature = inspect.signature(target)
        except (TypeError, ValueError) as e:
            raise PrecompileError(f"{what}: cannot read its signature: {e}") from e
        try:
            hints = typing.get_type_hints(self.code)
        except Exception:  # noqa: BLE001 - unresolvable string annotations
            hints = {}
        self.params: List[Param] = []
        # The names of the signature's *args and **kwargs, if it has them.
        self.var_positional: Optional[str] = None
        self.var_keyword: Optional[str] = None
        self.var_positional_count: Optional[int] = None
        for p in self.signature.parameters.values():
            if p.kind == inspect.Parameter.VAR_POSITIONAL:
                self.var_positional = p.name
                continue
            if p.kind == inspect.Parameter.VAR_KEYWORD:
                self.var_keyword = p.name
                continue
            kind, optional = _kind_of_annotation(hints.get(p.name, p.annotation))
            has_default = p.default is not inspect.Parameter.empty
            default = p.default if has_default else None
            if has_default and isinstance(default, torch.Tensor):
                raise PrecompileError(
                    f"{what}: parameter '{p.name}' has a tensor default; the artifact "
                    "records defaults as scalars (use None and create the tensor inside)"
                )
            if has_default and default is not None and kind_of_value(default) is None:
                raise PrecompileError(
                    f"{what}: parameter '{p.name}' has a default of type "
                    f"{type(default).__name__}; defaults must be None, bool, int, float or str"
                )
            self.params.append(
                Param(
                    name=p.name,
                    kind=kind,
                    annotated=kind is not None,
                    has_default=has_default,
                    default=default,
                    binding=_BINDINGS[p.kind],
                    optional=optional,
                )
            )
        self.is_generator = inspect.isgeneratorfunction(self.code)
        # Capture state.
        self.variants: List[Variant] = []
        self.eager_fallback = False
        self.fallback_cause: Optional[FallbackCause] = None
        self.fallback_detail = ""
        self.fallback_exception = ""
        # The kind of eager program a flagged frame gets: "torchscript" or "python".
        self.eager_program = ""
        self.truncated = False
        self.compile_error = ""  # A compile error suppress_errors swallowed.
        self.calls = 0
        self.outputs: Optional[OutputSchema] = None
        # Automatic dynamic: per parameter index, the sizes earlier captures saw
        # (None marks a dimension that is dynamic from now on).
        self.seen_sizes: Dict[int, List[Optional[int]]] = {}
        # Per call a variant was compiled from: each input's shape (None for
        # a value that is not a tensor).
        self.compiled_shapes: List[List[Optional[Tuple[int, ...]]]] = []
        # The structure of each parameter whose leaves are inputs, by name.
        self.trees: Dict[str, pytree.TreeSpec] = {}
        # The entry's largest sizes its variants take (capture's max_sizes):
        # per parameter name, per dimension (None: every one), the size.
        self.size_limits: Dict[str, Dict[Optional[int], int]] = {}
        # Per parameter that a call passed an empty structure (no tensor
        # leaves: a cache before its first call, as model.generate() passes
        # it), that structure's spec: where the parameter's leaves are
        # absent, the frame's code gets such an empty structure again, not
        # None (for a transformers cache the two mean the same, but a model
        # that builds the cache itself can do what Dynamo cannot trace).
        self.empty_trees: Dict[str, pytree.TreeSpec] = {}

    # -- calls -----------------------------------------------------------------

    def call_original(self, *args: Any, **kwargs: Any) -> Any:
        if self.module is not None:
            return self.code(self.module, *args, **kwargs)
        return self.code(*args, **kwargs)

    def bind(self, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> List[Any]:
        """The call's inputs in the frame's order (defaults applied; an entry of
        **kwargs the call leaves out is None). An entry of *args or **kwargs
        seen for the first time becomes a new input of the frame."""
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError as e:
            raise PrecompileError(
                f"frame '{self.name}': the call does not match its signature "
                f"{self.signature}: {e}"
            ) from e
        bound.apply_defaults()
        if self.var_positional is not None:
            extra = bound.arguments.get(self.var_positional, ())
            if self.var_positional_count is None:
                self.var_positional_count = len(extra)
                for i in range(len(extra)):
                    self._add_var_input(f"{self.var_positional}.{i}", Binding.VAR_POSITIONAL)
            elif len(extra) != self.var_positional_count:
                raise PrecompileError(
                    f"frame '{self.name}': this call passes {len(extra)} values through "
                    f"*{self.var_positional}, an earlier one {self.var_positional_count}; the "
                    "example calls of a frame must pass the same number (capture a wrapper "
                    "with named parameters otherwise)"
                )
        if self.var_keyword is not None:
            known = {p.name for p in self.params}
            for key in bound.arguments.get(self.var_keyword, {}):
                if key not in known:
                    self._add_var_input(key, Binding.VAR_KEYWORD)
        leaves: Dict[str, Optional[List[Any]]] = {name: None for name in self.trees}
        arguments = dict(bound.arguments)
        for name, value in bound.arguments.items():
            if name in (self.var_positional, self.var_keyword):
                continue
            empty = _empty_structure(value)
            if empty is not None:
                self._empty_tree(name, value, empty)
                arguments[name] = None
                continue
            flat = _flattened_structure(value)
            if flat is not None:
                leaves[name] = self._tree_leaves(name, value, *flat)
        values: List[Any] = []
        taken: Dict[str, int] = {}
        for p in self.params:
            if p.tree:
                index = taken.get(p.tree, 0)
                taken[p.tree] = index + 1
                values.append(None if leaves[p.tree] is None else leaves[p.tree][index])
            elif p.binding is Binding.VAR_POSITIONAL:
                values.append(bound.arguments[self.var_positional][int(p.name.rsplit(".", 1)[1])])
            elif p.binding is Binding.VAR_KEYWORD:
                values.append(bound.arguments.get(self.var_keyword, {}).get(p.name))
            else:
                values.append(arguments[p.name])
        return values

    def _empty_tree(self, name: str, value: Any, spec: pytree.TreeSpec) -> None:
        known = self.empty_trees.setdefault(name, spec)
        if known != spec:
            raise PrecompileError(
                f"frame '{self.name}', parameter '{name}': this call passes an empty "
                f"{type(value).__name__} unlike the empty structure an earlier call passed "
                f"({_spec_type_name(known)}); a parameter's empty structure must be the same "
                "on every call that passes one"
            )

    def _tree_leaves(self, name: str, value: Any, with_paths: List[Tuple[Any, Any]],
                     spec: pytree.TreeSpec) -> List[Any]:
        """The leaves of structure `value` (flattened: `with_paths`, `spec`)
        passed for parameter `name`; the first structure makes the
        parameter's leaves inputs."""
        if name not in self.trees:
            where = next(i for i, p in enumerate(self.params) if p.name == name)
            if self.params[where].kind not in (None, Kind.OPTIONAL_TENSOR):
                raise PrecompileError(
                    f"frame '{self.name}', parameter '{name}': got a {type(value).__name__} but "
                    f"earlier calls or its annotation made it {self.params[where].kind.value}"
                )
            self._expand_tree(where, spec, [f"{name}.{path_words(path)}" for path, _ in with_paths])
        elif spec != self.trees[name]:
            raise PrecompileError(
                f"frame '{self.name}', parameter '{name}': this call passes a structure of "
                f"{spec.num_leaves} leaves ({type(value).__name__}) unlike an earlier call's "
                f"{self.trees[name].num_leaves}; a parameter's structure (its type, keys and "
                "lengths) must be the same on every call that does not pass None"
            )
        return [leaf for _, leaf in with_paths]

    def _expand_tree(self, where: int, spec: pytree.TreeSpec, names: List[str]) -> None:
        """Parameter `where` becomes one input per leaf of `spec`, in its place:
        the variants captured so far, which were passed None for it, are
        passed None for each leaf."""
        p = self.params[where]
        for name in names:
            if any(q.name == name for q in self.params):
                raise PrecompileError(f"frame '{self.name}': input '{name}' would have the name of another input")
        leaves = [
            Param(name=name, kind=Kind.OPTIONAL_TENSOR if p.kind is Kind.OPTIONAL_TENSOR else None,
                  annotated=False, has_default=p.has_default, default=None, binding=p.binding,
                  optional=True, tree=p.name)
            for name in names
        ]
        self.params[where:where + 1] = leaves
        self.trees[p.name] = spec
        extra = len(leaves) - 1

        def moved(i: int) -> int:
            return i + extra if i > where else i

        for v in self.variants:
            args = []
            for g in v.guards.args:
                if g.parameter == where:
                    args.extend(ArgGuard(parameter=where + k, is_none=True) for k in range(len(leaves)))
                else:
                    args.append(dataclasses.replace(g, parameter=moved(g.parameter)))
            v.guards = dataclasses.replace(
                v.guards, args=tuple(args),
                index_ranges=tuple((moved(i), lo, hi) for i, lo, hi in v.guards.index_ranges),
            )
            v.tensor_inputs = [moved(i) for i in v.tensor_inputs]
        self.seen_sizes = {moved(i): sizes for i, sizes in self.seen_sizes.items() if i != where}
        self.compiled_shapes = [
            shapes[:where] + [None] * len(leaves) + shapes[where + 1:] for shapes in self.compiled_shapes
        ]

    def call_arguments(self, values: List[Any]) -> Tuple[List[Any], Dict[str, Any]]:
        """How to call the frame's code on its inputs in order: positional
        arguments and keywords, structures rebuilt from their leaves (a
        None entry of **kwargs is left out, as it was absent).

        Parameters go as Python callers pass them: the required ones by
        position, those with a default by keyword
        (precompile_eager.passed_by_position, which says why)."""
        star_args = bool(self.var_positional_count)
        args: List[Any] = []
        kwargs: Dict[str, Any] = {}
        trees: Dict[str, List[Any]] = {}
        for p, v in zip(self.params, values):
            if p.tree:
                leaves = trees.setdefault(p.tree, [])
                leaves.append(v)
                if len(leaves) < self.trees[p.tree].num_leaves:
                    continue
                name = p.tree
                v = precompile_eager.structure_from_leaves(self.trees[p.tree], leaves)
            else:
                name = p.name
            if v is None and name in self.empty_trees:
                v = pytree.tree_unflatten([], self.empty_trees[name])
            if precompile_eager.passed_by_position(EAGER_BINDINGS[p.binding], p.has_default, star_args):
                args.append(v)
            elif not (p.binding is Binding.VAR_KEYWORD and v is None):
                kwargs[name] = v
        return args, kwargs

    def _add_var_input(self, name: str, binding: Binding) -> None:
        if any(p.name == name for p in self.params):
            star = f"**{self.var_keyword}" if binding is Binding.VAR_KEYWORD else f"*{self.var_positional}"
            raise PrecompileError(
                f"frame '{self.name}': input '{name}' of {star} would have the name of another input"
            )
        keyword = binding is Binding.VAR_KEYWORD
        self.params.append(
            Param(name=name, kind=None, annotated=False, has_default=keyword, default=None, binding=binding)
        )
        if keyword:
            # Variants captured before it was seen were captured without it.
            index = len(self.params) - 1
            for v in self.variants:
                v.guards = dataclasses.replace(
                    v.guards, args=v.guards.args + (ArgGuard(parameter=index, is_none=True),)
                )

    def observe(self, values: List[Any]) -> None:
        """Infers parameter kinds from a call; rejects values a frame cannot take."""
        for p, v in zip(self.params, values):
            where = f"frame '{self.name}', parameter '{p.name}'"
            if v is None:
                if p.kind is None:
                    p.kind = Kind.OPTIONAL_TENSOR
                    p.none_guess = not p.annotated
                elif p.kind is Kind.TENSOR and not p.annotated:
                    p.kind = Kind.OPTIONAL_TENSOR
                elif p.kind is not Kind.OPTIONAL_TENSOR and not p.optional and not (
                    p.has_default and p.default is None
                ):
                    raise PrecompileError(f"{where}: got None but it takes {p.kind.value}")
                continue
            if not (p.has_default and _same_default(p.default, v)):
                p.passed = True
            seen = kind_of_value(v)
            if seen is None:
                raise PrecompileError(
                    f"{where}: got a {type(v).__name__}; a frame's arguments must be "
                    "tensors, None, bool, int, float or str (capture a wrapper that takes "
                    "the tensors inside it, or capture the sub-modules it calls as frames)"
                )
            if isinstance(v, torch.Tensor):
                if v.dtype not in SUPPORTED_DTYPES:
                    raise PrecompileError(
                        f"{where}: dtype {v.dtype} is not one the artifact format names"
                    )
                if p.example_dtype is None:
                    p.example_dtype = v.dtype
            if p.kind is None:
                p.kind = seen
            elif p.kind is seen or (p.kind is Kind.OPTIONAL_TENSOR and seen is Kind.TENSOR):
                p.none_guess = False
            elif p.kind is Kind.FLOAT and seen is Kind.INT:
                pass
            elif p.kind is Kind.INT and seen is Kind.FLOAT and not p.annotated:
                p.kind = Kind.FLOAT
                # The manifest writes earlier variants' values of it as floats.
                index = self.params.index(p)
                for variant in self.variants:
                    variant.guards = dataclasses.replace(variant.guards, args=tuple(
                        dataclasses.replace(g, value=float(g.value))
                        if g.parameter == index and g.has_value and type(g.value) is int else g
                        for g in variant.guards.args
                    ))
            elif p.none_guess and not seen.is_tensor:
                p.kind = seen
                p.none_guess = False
            else:
                raise PrecompileError(
                    f"{where}: got {seen.value} but earlier calls or its annotation made it "
                    f"{p.kind.value}"
                )

    def normalize(self, values: List[Any]) -> List[Any]:
        """The values as the runtime's guards see them: a float parameter's
        ints are floats (the runtime converts them before its guards)."""
        return [
            float(v) if p.kind is Kind.FLOAT and type(v) is int else v for p, v in zip(self.params, values)
        ]

    def observe_result(self, result: Any) -> None:
        if self.is_generator:
            return
        schema = output_schema(self.name, result)
        if self.outputs is None:
            self.outputs = schema
        elif self.outputs != schema:
            raise PrecompileError(
                f"frame '{self.name}' returned {schema.describe()} as {schema.tree_spec} but an "
                f"earlier call returned {self.outputs.describe()} as {self.outputs.tree_spec}; "
                "a frame must return the same structure on every call (the same keys, and "
                "lists of the same length): capture calls that differ in it as separate models, "
                "or capture a wrapper that returns a fixed structure"
            )

    # -- state -------------------------------------------------------------------

    def flag(self, cause: FallbackCause, detail: str, exception: str = "") -> None:
        self.eager_fallback = True
        self.fallback_cause = cause
        self.fallback_detail = detail
        self.fallback_exception = exception

    @property
    def variantless_entry_fallback(self) -> bool:
        return self.is_entry and self.eager_fallback and not self.variants

    @property
    def skipped(self) -> bool:
        """Dynamo would skip this frame for the rest of the capture."""
        return self.eager_fallback or bool(self.compile_error)


def _same_default(default: Any, value: Any) -> bool:
    if isinstance(value, torch.Tensor) or default is None:
        return False
    return type(default) is type(value) and default == value


def _spec_type_name(spec: pytree.TreeSpec) -> str:
    return getattr(spec.type, "__name__", str(spec.type))


def _empty_structure(value: Any) -> Optional[pytree.TreeSpec]:
    """The spec of `value` if it is a structure (a registered pytree node
    other than a tuple, list or dict) with no leaves at all; else None."""
    if value is None or isinstance(value, (torch.Tensor, tuple, list, dict)) or kind_of_value(value) is not None:
        return None
    register_known_structures(value)
    if type(value) not in pytree.SUPPORTED_NODES:
        return None
    leaves, spec = pytree.tree_flatten(value)
    return spec if not leaves else None


def _flattened_structure(value: Any) -> Optional[Tuple[List[Tuple[Any, Any]], pytree.TreeSpec]]:
    """`value` flattened with the paths of its leaves, if it is neither a
    scalar, None nor a tensor but holds tensors; else None."""
    if value is None or isinstance(value, torch.Tensor) or kind_of_value(value) is not None:
        return None
    register_known_structures(value)
    with_paths, spec = pytree.tree_flatten_with_path(value)
    return (with_paths, spec) if any(isinstance(leaf, torch.Tensor) for _, leaf in with_paths) else None
