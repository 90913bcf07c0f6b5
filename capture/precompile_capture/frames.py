"""Frames: the entry and the sub-frames a capture handles as units.

A frame is a module's `forward` (the entry module, or a sub-module named by its
path) or a plain function. Its parameters are its Python signature (without
`self`); each has a kind (tensor, optional tensor, int, float, bool, str) taken
from its annotation or, when there is none, from the first call that passes a
value for it.
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import typing
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from .errors import PrecompileError
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


def _kind_of_annotation(annotation: Any) -> Optional[Kind]:
    if annotation is inspect.Parameter.empty or annotation is None:
        return None
    if annotation in _ANNOTATION_KINDS:
        return _ANNOTATION_KINDS[annotation]
    if typing.get_origin(annotation) is typing.Union:
        members = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(members) == 1 and members[0] is torch.Tensor:
            return Kind.OPTIONAL_TENSOR
    return None


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
    keyword_only: bool
    example_dtype: Optional[torch.dtype] = None
    # The kind was guessed from a None: a later scalar may still decide it.
    none_guess: bool = False

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
    num_outputs: int
    outputs: List[Tuple[torch.dtype, List[int]]]  # (dtype, shape with -1 for dynamic) each.
    captured_from: str
    compile_seconds: float


@dataclasses.dataclass(frozen=True)
class FrameInfo:
    """A read-only view of one frame's capture state."""

    name: str
    is_entry: bool
    parameters: Tuple[Tuple[str, str], ...]  # (name, kind) pairs.
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
        for p in self.signature.parameters.values():
            if p.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
                raise PrecompileError(
                    f"{what}: parameter '{p.name}' is *args or **kwargs; a frame's "
                    "parameters must be named"
                )
            annotation = hints.get(p.name, p.annotation)
            kind = _kind_of_annotation(annotation)
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
            if kind is None and has_default and default is None:
                kind = None  # Decided by the first value passed.
            self.params.append(
                Param(
                    name=p.name,
                    kind=kind,
                    annotated=kind is not None,
                    has_default=has_default,
                    default=default,
                    keyword_only=p.kind == inspect.Parameter.KEYWORD_ONLY,
                )
            )
        self.is_generator = inspect.isgeneratorfunction(self.code)
        # Capture state.
        self.variants: List[Variant] = []
        self.eager_fallback = False
        self.fallback_cause: Optional[FallbackCause] = None
        self.fallback_detail = ""
        self.fallback_exception = ""
        self.truncated = False
        self.compile_error = ""  # A compile error suppress_errors swallowed.
        self.calls = 0
        self.outputs: Optional[Tuple[bool, int]] = None  # (is_tuple, num_tensors)
        # Automatic dynamic: per parameter index, the sizes earlier captures saw
        # (None marks a dimension that is dynamic from now on).
        self.seen_sizes: Dict[int, List[Optional[int]]] = {}

    # -- calls -----------------------------------------------------------------

    def call_original(self, *args: Any, **kwargs: Any) -> Any:
        if self.module is not None:
            return self.code(self.module, *args, **kwargs)
        return self.code(*args, **kwargs)

    def bind(self, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> List[Any]:
        """The call's full argument list in signature order (defaults applied)."""
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError as e:
            raise PrecompileError(f"frame '{self.name}': {e}") from e
        bound.apply_defaults()
        return [bound.arguments[p.name] for p in self.params]

    def split(self, values: List[Any]) -> Tuple[List[Any], Dict[str, Any]]:
        """Positional arguments and keyword-only arguments for `values`."""
        args = [v for p, v in zip(self.params, values) if not p.keyword_only]
        kwargs = {p.name: v for p, v in zip(self.params, values) if p.keyword_only}
        return args, kwargs

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
                elif p.kind is not Kind.OPTIONAL_TENSOR and not (p.has_default and p.default is None):
                    raise PrecompileError(f"{where}: got None but it takes {p.kind.value}")
                continue
            seen = kind_of_value(v)
            if seen is None:
                raise PrecompileError(
                    f"{where}: got a {type(v).__name__}; a frame's arguments must be "
                    "tensors, None, bool, int, float or str"
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
            elif p.none_guess and not seen.is_tensor:
                p.kind = seen
                p.none_guess = False
            else:
                raise PrecompileError(
                    f"{where}: got {seen.value} but earlier calls or its annotation made it "
                    f"{p.kind.value}"
                )

    def observe_result(self, result: Any) -> None:
        if self.is_generator:
            return
        if isinstance(result, torch.Tensor):
            structure = (False, 1)
        elif isinstance(result, tuple) and result and all(
            isinstance(t, torch.Tensor) for t in result
        ):
            structure = (True, len(result))
        else:
            raise PrecompileError(
                f"frame '{self.name}' returned {_describe_value(result)}; a frame must "
                "return a tensor or a tuple of tensors"
            )
        if self.outputs is None:
            self.outputs = structure
        elif self.outputs != structure:
            raise PrecompileError(
                f"frame '{self.name}' returned {_structure_words(structure)} but an earlier "
                f"call returned {_structure_words(self.outputs)}"
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


def _describe_value(value: Any) -> str:
    if isinstance(value, (tuple, list)):
        inner = ", ".join(type(v).__name__ for v in value)
        return f"a {type(value).__name__} of ({inner})"
    return f"a {type(value).__name__}"


def _structure_words(structure: Tuple[bool, int]) -> str:
    is_tuple, n = structure
    return f"a tuple of {n} tensors" if is_tuple else "a tensor"
