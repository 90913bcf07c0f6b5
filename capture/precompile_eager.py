"""The Python side of Python eager programs, shared by the capture and the server.

A flagged frame that TorchScript cannot express gets a Python eager program:
the capture saves (torch.save) a `Program` holding the frame's own module or
function with its weights: code from installed distributions by reference,
the model's own code by value (cloudpickle, which the server's environment
then needs too). Inside it, each captured frame the
frame calls is replaced by a `FrameCall`, whose calls go through the operator
`precompile::call_frame`, so that the runtime serves the callee with its own
variants (and refuses its own misses) as it does for TorchScript programs.

Pickle names these classes by module and name, so the server must know this
module by the same name: its embedded interpreter has this very file built in
(runtime/BUILD.bazel) and installs it as `precompile_eager` before it loads a
program. Everything else a program refers to is imported from the server's
Python environment; `check_environment` says what is missing there.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import importlib.util
import linecache
import sys
import warnings
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import torch
import torch.utils._pytree as pytree
import torch.utils.dlpack

# How a parameter takes its argument, as the manifest's Parameter.Binding.
POSITIONAL_ONLY = "positional_only"
POSITIONAL_OR_KEYWORD = "positional_or_keyword"
KEYWORD_ONLY = "keyword_only"
# A value the capture saw passed through *args (named "args.0", ...) or
# **kwargs (named by its key; None stands for absent).
VAR_POSITIONAL = "var_positional"
VAR_KEYWORD = "var_keyword"
_POSITIONAL = (POSITIONAL_ONLY, POSITIONAL_OR_KEYWORD, VAR_POSITIONAL)


def passed_by_position(binding: str, has_default: bool, star_args: bool) -> bool:
    """Whether a frame's parameter is passed by position, as Python callers
    pass it: the required ones by position, those with a default by keyword
    (all by position where the frame takes *args entries, `star_args`).

    A decorator in front of the code that reads its optional arguments from
    **kwargs (transformers' merge_with_config_defaults adds
    use_cache=config.use_cache where no keyword names it) would otherwise
    add a second value for one passed positionally. Python refuses that
    call, but Dynamo, tracing it, puts the second value into the code's
    **kwargs, from which it can override the code's own choice
    (BigBirdModel then returns the DynamicCache its eager call never
    makes). Required ones stay positional for the hooks that read a
    module's inputs by position. The capture (Frame.call_arguments) and the
    served program (Program) call a frame alike."""
    return binding in (POSITIONAL_ONLY, VAR_POSITIONAL) or (
        binding == POSITIONAL_OR_KEYWORD and (not has_default or star_args))


@dataclasses.dataclass(frozen=True)
class Param:
    name: str
    binding: str
    has_default: bool = False
    default: Any = None
    # A leaf of a structure: the frame parameter's name and its structure.
    tree: str = ""
    tree_spec: Optional[pytree.TreeSpec] = None


def register_known_structures(cls: type) -> None:
    """Makes `cls` a pytree node where its library says how: transformers'
    DynamicCache (its keys and values per layer, as transformers exports it)
    and EncoderDecoderCache (T5's and BART's: a DynamicCache for the
    decoder's own positions and one for the encoder's, each named by its
    attribute)."""
    if cls in pytree.SUPPORTED_NODES or not (cls.__module__ or "").startswith("transformers"):
        return
    if cls.__name__ == "DynamicCache":
        from transformers.integrations.executorch import register_dynamic_cache_export_support  # noqa: PLC0415

        register_dynamic_cache_export_support()
    elif cls.__name__ == "EncoderDecoderCache":
        from transformers.cache_utils import DynamicCache  # noqa: PLC0415

        register_known_structures(DynamicCache)
        pytree.register_pytree_node(
            cls,
            lambda cache: ([getattr(cache, name) for name in _ENCODER_DECODER_CACHES], None),
            # Built as transformers builds it: which layers' encoder keys
            # are already cached follows from the cross-attention cache.
            lambda children, _: cls(*children),
            serialized_type_name=f"{cls.__module__}.{cls.__name__}",
            flatten_with_keys_fn=lambda cache: (
                [(pytree.GetAttrKey(name), getattr(cache, name)) for name in _ENCODER_DECODER_CACHES],
                None,
            ),
        )


_ENCODER_DECODER_CACHES = ("self_attention_cache", "cross_attention_cache")


def _spec_types(spec: pytree.TreeSpec) -> Iterator[type]:
    if not spec.is_leaf():
        yield spec.type
        for child in spec.children():
            yield from _spec_types(child)


def _grouped(params: Sequence[Param]) -> List[Tuple[Param, int]]:
    """The frame's own parameters: each with its number of inputs (a
    structure's leaves are one parameter, named as the frame names it)."""
    out: List[Tuple[Param, int]] = []
    for p in params:
        if p.tree and out and out[-1][0].name == p.tree:
            out[-1] = (out[-1][0], out[-1][1] + 1)
        elif p.tree:
            out.append((Param(p.tree, p.binding, p.has_default, None, p.tree, p.tree_spec), 1))
        else:
            out.append((p, 1))
    return out


def _leaves(frame: str, p: Param, value: Any) -> List[Any]:
    """The inputs a structure parameter's value gives: its leaves, or Nones."""
    assert p.tree_spec is not None
    if value is None:
        return [None] * p.tree_spec.num_leaves
    register_known_structures(type(value))
    leaves, spec = pytree.tree_flatten(value)
    if spec != p.tree_spec:
        raise TypeError(
            f"frame '{frame}', argument '{p.name}': a {type(value).__name__} of {spec.num_leaves} "
            f"leaves unlike the structure it was captured with ({p.tree_spec.num_leaves} leaves)"
        )
    return leaves


def structure_from_leaves(spec: pytree.TreeSpec, leaves: List[Any]) -> Any:
    """The structure `spec` describes, from its leaves; None where every leaf
    is None (a call that passed None for it). Its node types must be
    registered (Dynamo traces this inside the capture's export)."""
    if all(leaf is None for leaf in leaves):
        return None
    return pytree.tree_unflatten(leaves, spec)


def _structure(p: Param, leaves: List[Any]) -> Any:
    assert p.tree_spec is not None
    for cls in _spec_types(p.tree_spec):
        register_known_structures(cls)
    return structure_from_leaves(p.tree_spec, leaves)


def bind(frame: str, params: Sequence[Param], args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> List[Any]:
    """The arguments of a call of `frame`, one per parameter in order, bound
    as Python binds them (defaults filled in; a structure gives its leaves)."""
    values: List[Any] = []
    for p, value in zip([p for p, _ in _grouped(params)], _bind_grouped(frame, params, args, kwargs)):
        values.extend(_leaves(frame, p, value) if p.tree else [value])
    return values


def _bind_grouped(frame: str, leaf_params: Sequence[Param], args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> List[Any]:
    params = [p for p, _ in _grouped(leaf_params)]
    values: List[Any] = []
    positional = list(args)
    by_keyword = {p.name for p in params if p.binding not in (POSITIONAL_ONLY, VAR_POSITIONAL)}
    unknown = set(kwargs) - by_keyword
    if unknown:
        raise TypeError(f"frame '{frame}' got unexpected keyword arguments {sorted(unknown)}")
    taken = 0
    for p in params:
        if p.binding in _POSITIONAL and taken < len(positional):
            if p.name in kwargs:
                raise TypeError(f"frame '{frame}' got multiple values for argument '{p.name}'")
            values.append(positional[taken])
            taken += 1
        elif p.name in kwargs:
            values.append(kwargs[p.name])
        elif p.has_default or p.binding == VAR_KEYWORD:
            values.append(p.default)
        else:
            raise TypeError(f"frame '{frame}' is missing argument '{p.name}'")
    if taken < len(positional):
        raise TypeError(f"frame '{frame}' takes {taken} positional arguments but {len(positional)} were given")
    return values


def register_dataclasses(value: Any) -> List[type]:
    """Makes the dataclasses in `value` pytree nodes, as torch.export needs
    them (transformers' ModelOutput registers itself; a model's own dataclass
    would otherwise be one opaque leaf). Returns the classes it registered."""
    registered: List[type] = []
    seen: set = set()

    def visit(v: Any) -> None:
        if id(v) in seen or isinstance(v, torch.Tensor):
            return
        seen.add(id(v))
        cls = type(v)
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            if cls not in pytree.SUPPORTED_NODES:
                torch.export.register_dataclass(cls, serialized_type_name=f"{cls.__module__}.{cls.__qualname__}")
                registered.append(cls)
            for f in dataclasses.fields(v):
                visit(getattr(v, f.name, None))
        elif isinstance(v, dict):
            for e in v.values():
                visit(e)
        elif isinstance(v, (list, tuple)):
            for e in v:
                visit(e)

    visit(value)
    return registered


class FrameCall(torch.nn.Module):
    """Stands in for a captured sub-module inside a Python eager program.

    It binds a call as the sub-module's forward would, calls the frame through
    the runtime's dispatcher, which returns the frame's tensor leaves, and
    rebuilds the structure the frame returned when captured (its non-tensor
    leaves are all None: the capture refuses any other).
    """

    def __init__(self, frame: str, params: Sequence[Param], spec: pytree.TreeSpec, leaf_is_tensor: Sequence[bool]) -> None:
        super().__init__()
        self.frame = frame
        self.params = tuple(params)
        self.spec = spec
        self.leaf_is_tensor = tuple(leaf_is_tensor)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        values = bind(self.frame, self.params, args, kwargs)
        tensors = torch.ops.precompile.call_frame(self.frame, values)
        if len(tensors) != sum(self.leaf_is_tensor):
            raise RuntimeError(
                f"frame '{self.frame}' returned {len(tensors)} tensors, but it returned "
                f"{sum(self.leaf_is_tensor)} when captured"
            )
        it = iter(tensors)
        leaves = [next(it) if is_tensor else None for is_tensor in self.leaf_is_tensor]
        return pytree.tree_unflatten(leaves, self.spec)

    def extra_repr(self) -> str:
        return f"frame={self.frame!r}"


class Stopped(BaseException):
    """Raised in a program's thread by the server when its call should end
    (the client cancelled it, or it ran past its deadline). A BaseException,
    so that the model's own `except Exception` does not swallow it."""


class Program:
    """A frame's Python eager program: its module (called like the module, so
    its hooks run) or function, and how its parameters take their values.
    `sources` holds the text of the files its by-value code came from (by
    file name, as its code objects name them), for tracebacks at the server,
    which has none of those files."""

    def __init__(self, frame: str, target: Any, params: Sequence[Param], sources: Optional[Dict[str, str]] = None) -> None:
        self.frame = frame
        self.target = target
        self.params = tuple(params)
        self.sources = dict(sources or {})

    def __call__(self, values: Sequence[Any]) -> List[Any]:
        """Runs the frame on one value per parameter, in order; returns the
        leaves of its result in torch.utils._pytree's order."""
        if len(values) != len(self.params):
            raise TypeError(f"frame '{self.frame}' takes {len(self.params)} arguments, not {len(values)}")
        star_args = any(p.binding == VAR_POSITIONAL for p in self.params)
        positional: List[Any] = []
        keywords: Dict[str, Any] = {}
        start = 0
        for p, count in _grouped(self.params):
            v = _structure(p, list(values[start:start + count])) if p.tree else values[start]
            start += count
            if passed_by_position(p.binding, p.has_default, star_args):
                positional.append(v)
            elif p.binding != VAR_KEYWORD or v is not None:
                keywords[p.name] = v
        result = self.target(*positional, **keywords)
        register_dataclasses(result)
        return pytree.tree_leaves(result)


def load(path: str, device: str) -> Program:
    """Loads a saved program with its weights on `device`, ready to run."""
    with warnings.catch_warnings():
        # torch's pickled pytree specs warn of their own deprecations.
        warnings.simplefilter("ignore", FutureWarning)
        program = torch.load(path, map_location=device, weights_only=False)
    if not isinstance(program, Program):
        raise TypeError(f"{path} holds a {type(program).__qualname__}, not a precompile_eager.Program")
    for filename, text in getattr(program, "sources", {}).items():
        # No modification time: linecache.checkcache never drops them, and a
        # file of that name on this machine never stands in for them.
        linecache.cache[filename] = (len(text), None, text.splitlines(True), filename)
    if isinstance(program.target, torch.nn.Module):
        program.target.eval()
    return program


def distribution_version(module: str) -> str:
    """The version of the installed distribution providing top-level
    `module`, or "" when none does (code on sys.path only)."""
    for dist in importlib.metadata.packages_distributions().get(module, []):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return ""


def check_environment(python_version: str, modules: Sequence[Tuple[str, str]]) -> Optional[str]:
    """Why this interpreter cannot run programs captured under
    `python_version` that need `modules` ((name, version) pairs; an empty
    version asks only that the module be importable), or None."""
    wanted = tuple(int(x) for x in python_version.split(".")[:2])
    if wanted != sys.version_info[:2]:
        return (
            f"the artifact's Python eager programs were captured with Python {python_version}; "
            f"the server's Python is {sys.version.split()[0]}"
        )
    for name, version in modules:
        if importlib.util.find_spec(name) is None:
            needed = f"{name} {version}" if version else name
            return f"the artifact's Python eager programs need module {needed}, which the server's Python environment ({sys.prefix}) lacks"
        if version:
            have = distribution_version(name)
            if have != version:
                return (
                    f"the artifact's Python eager programs need module {name} {version}; the "
                    f"server's Python environment ({sys.prefix}) has {name} {have or '(no version)'}"
                )
    return None


def run(program: Program, values: List[Any], tensor_indices: Sequence[int]) -> List[Any]:
    """The server's way into a program: the values at `tensor_indices` come
    as DLPack capsules and become tensors (sharing memory); the tensors among
    the result's leaves go back as capsules."""
    for i in tensor_indices:
        values[i] = torch.from_dlpack(values[i])
    leaves = program(values)
    return [torch.utils.dlpack.to_dlpack(x.detach()) if isinstance(x, torch.Tensor) else x for x in leaves]
