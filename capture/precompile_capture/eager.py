"""Eager programs: a flagged frame as TorchScript, for the runtime's eager path.

Only a frame flagged `eager_fallback` may run eagerly at serve time, so only
such a frame gets an eager program. It is the frame's TorchScript `forward`,
taking the frame's inputs positionally in order and returning what the frame
returns (the runtime flattens it into the frame's output leaves). Calls of
other captured frames inside it go through the operator
`precompile::call_frame(str frame, Any[] args) -> Tensor[]`, so that the
runtime dispatches each callee to its own variants; every loop body starts
with `precompile::check_cancelled()`, so that the runtime can end a call
whose deadline passed inside a loop. To get there, scripting a
frame temporarily replaces captured sub-modules by generated stub modules and
captured functions (in the globals of the code that calls them) by generated
stub functions whose body calls the operator. TorchScript compiles from
source, so the stubs are written to a real temporary file and imported.

TorchScript cannot express much of the Python that makes Dynamo give up
(`**kwargs`, dataclasses, most of `transformers`): the capture scripts a frame
as soon as it is flagged, so that such a frame is reported at once, with the
ways out, rather than when the artifact is saved.

TorchScript is deprecated upstream; this module is the one place that knows
about it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import itertools
import math
import os
import sys
import tempfile
import warnings
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import torch

from . import ops
from .errors import PrecompileError
from .frames import Binding, Frame, Kind

_RESERVED = {"torch", "List", "Any", "Optional", "Tuple", "_pc_args", "_pc_outs", "self"}
_ANNOTATIONS = {
    Kind.TENSOR: "torch.Tensor",
    Kind.OPTIONAL_TENSOR: "Optional[torch.Tensor]",
    Kind.INT: "int",
    Kind.FLOAT: "float",
    Kind.BOOL: "bool",
    Kind.STRING: "str",
}
_SCHEMA_TYPES = {
    Kind.TENSOR: ("Tensor",),
    Kind.OPTIONAL_TENSOR: ("Optional[Tensor]", "Tensor?"),
    Kind.INT: ("int",),
    Kind.FLOAT: ("float",),
    Kind.BOOL: ("bool",),
    Kind.STRING: ("str",),
}
_WAYS_OUT = (
    "Ways out: capture with eager=\"python\" (or \"auto\") to run the frame's own Python; capture the parts Dynamo compiles as frames of their own (frames=[...]) and "
    "a wrapper entry whose eager code TorchScript can script; move what makes Dynamo give up "
    "out of the frame; or capture calls that Dynamo compiles, so that the frame is not flagged"
)
_module_counter = itertools.count()

# A frame's output structure as TorchScript stubs return it: (is_tuple, number
# of tensors), or None when the frame returns anything else (or is unknown).
Structure = Optional[Tuple[bool, int]]


@dataclasses.dataclass
class ScriptContext:
    """What scripting needs to know of a capture: its model and frames."""

    model: Any  # The entry nn.Module or function.
    frames: Sequence[Frame]
    # Per function frame: the globals dicts in which the calling code finds it.
    globals_sites: Dict[str, List[Dict[str, Any]]]


def _literal(value: Any) -> str:
    if isinstance(value, float) and not math.isfinite(value):
        return f"float({str(value)!r})"
    return repr(value)


def _inexpressible(frame: Frame) -> Optional[str]:
    """Why TorchScript cannot take the frame's signature, or None."""
    if frame.var_positional or frame.var_keyword:
        star = f"*{frame.var_positional}" if frame.var_positional else f"**{frame.var_keyword}"
        return f"its signature takes {star}, which TorchScript cannot express"
    for p in frame.params:
        if p.name in _RESERVED or not p.name.isidentifier():
            return f"parameter '{p.name}' has a name the generated TorchScript stubs cannot use"
    return None


def _signature_source(frame: Frame) -> str:
    # Every parameter positional, in signature order (TorchScript takes no
    # keyword-only parameters with defaults; callers may still pass keywords).
    parts = []
    for p in frame.params:
        text = f"{p.name}: {_ANNOTATIONS[p.final_kind()]}"
        if p.has_default:
            text += f" = {_literal(p.default)}"
        parts.append(text)
    return ", ".join(["self"] + parts)


def _call_source(frame: Frame) -> str:
    return ", ".join(p.name if p.binding is not Binding.KEYWORD_ONLY else f"{p.name}={p.name}" for p in frame.params)


def _return_annotation(structure: Structure) -> str:
    if structure is None:
        return ""
    is_tuple, n = structure
    if not is_tuple:
        return " -> torch.Tensor"
    return " -> Tuple[" + ", ".join(["torch.Tensor"] * n) + "]"


def _return_source(structure: Tuple[bool, int]) -> str:
    is_tuple, n = structure
    if not is_tuple:
        return "_pc_outs[0]"
    return "(" + ", ".join(f"_pc_outs[{i}]" for i in range(n)) + ("," if n == 1 else "") + ")"


def _no_stub_marker(frame: str) -> str:
    # No quotes: the graph's printer escapes them.
    return f"precompile_capture: no TorchScript stub for frame <{frame}>"


class _Stubs:
    """A generated module of stubs (callee side) and wrappers (function frames).

    A frame TorchScript cannot call (a signature it cannot express, outputs
    that are not a tensor or a tuple of tensors) gets a stub that only raises
    (so that scripting code that never calls it succeeds); `check_calls` finds
    a scripted frame that does call one.
    """

    def __init__(self, frames: Sequence[Frame], structures: Dict[str, Structure]) -> None:
        self.frames = list(frames)
        lines = [
            "# Generated by precompile_capture: TorchScript stubs that call captured",
            "# frames through the runtime dispatcher.",
            "import torch",
            "from typing import Any, List, Optional, Tuple",
            "",
        ]
        self.stub_names: Dict[str, str] = {}
        self.no_stub: Dict[str, str] = {}
        self.wrapper_names: Dict[str, str] = {}
        self.target_names: Dict[str, str] = {}
        for i, frame in enumerate(self.frames):
            structure = structures[frame.name]
            inexpressible = _inexpressible(frame)
            if inexpressible:
                self.no_stub[frame.name] = inexpressible
            elif structure is None:
                self.no_stub[frame.name] = (
                    "it returns "
                    + (frame.outputs.describe() if frame.outputs else "something never seen")
                    + ", and a TorchScript eager program can call only frames that return a "
                    "tensor or a tuple of tensors"
                )
            if frame.function is not None and not inexpressible:
                wrapper = f"Frame{i}"
                target = f"_target{i}"
                lines += [
                    f"class {wrapper}(torch.nn.Module):",
                    f"    # The eager program of frame {frame.name!r}.",
                    f"    def forward({_signature_source(frame)}){_return_annotation(structure)}:",
                    f"        return {target}({_call_source(frame)})",
                    "",
                    "",
                ]
                self.wrapper_names[frame.name] = wrapper
                self.target_names[frame.name] = target
            if frame.name in self.no_stub:
                signature_source = "self" if inexpressible else _signature_source(frame)
                body = [f"        raise RuntimeError({_no_stub_marker(frame.name)!r})"]
                structure = (False, 1)
            else:
                signature_source = _signature_source(frame)
                values = ", ".join(p.name for p in frame.params)
                body = [
                    f"        _pc_args: List[Any] = [{values}]",
                    f"        _pc_outs = torch.ops.precompile.call_frame({frame.name!r}, _pc_args)",
                    f"        return {_return_source(structure)}",
                ]
            if frame.module is not None:
                name = f"Stub{i}"
                lines += [
                    f"class {name}(torch.nn.Module):",
                    f"    # Calls frame {frame.name!r}.",
                    f"    def forward({signature_source}){_return_annotation(structure)}:",
                    *body,
                    "",
                    "",
                ]
            else:
                name = f"stub{i}_{frame.function.__name__}"
                signature = signature_source[len("self, ") if frame.params and signature_source != "self" else len("self"):]
                lines += [
                    f"def {name}({signature}){_return_annotation(structure)}:",
                    f"    # Calls frame {frame.name!r}.",
                    *[line[4:] for line in body],
                    "",
                    "",
                ]
            self.stub_names[frame.name] = name
        self.source = "\n".join(lines) + "\n"
        self._dir = tempfile.mkdtemp(prefix="precompile-stubs-")
        self.module_name = f"_precompile_stubs_{next(_module_counter)}"
        self.path = os.path.join(self._dir, self.module_name + ".py")
        with open(self.path, "w") as f:
            f.write(self.source)
        spec = importlib.util.spec_from_file_location(self.module_name, self.path)
        assert spec is not None and spec.loader is not None
        self.module = importlib.util.module_from_spec(spec)
        sys.modules[self.module_name] = self.module
        spec.loader.exec_module(self.module)
        for frame in self.frames:
            if frame.name in self.target_names:
                setattr(self.module, self.target_names[frame.name], frame.function)

    def close(self) -> None:
        sys.modules.pop(self.module_name, None)
        try:
            os.remove(self.path)
            os.rmdir(self._dir)
        except OSError:
            pass

    def stub(self, frame: Frame) -> Any:
        obj = getattr(self.module, self.stub_names[frame.name])
        return obj() if frame.module is not None else obj

    def check_calls(self, caller: Frame, scripted: torch.jit.ScriptModule) -> None:
        """Raises if `scripted` calls a frame that has only a raising stub."""
        graph = str(scripted.inlined_graph)
        for name, reason in self.no_stub.items():
            if _no_stub_marker(name) in graph:
                raise PrecompileError(
                    f"frame '{caller.name}' calls captured frame '{name}', but its TorchScript "
                    f"eager program cannot: {reason}"
                )

    def wrapper(self, frame: Frame) -> torch.nn.Module:
        return getattr(self.module, self.wrapper_names[frame.name])()


def _clear_torchscript_caches() -> None:
    """TorchScript caches compiled methods per module type and per function;
    the stubs patched in differ between frames and captures."""
    store = torch.jit._recursive.concrete_type_store
    store.type_store.clear()
    store.methods_compiled.clear()
    for cache in (torch.jit._state._jit_caching_layer, torch.jit._state._jit_function_overload_caching):
        for key in list(cache.keys()):
            cache.pop(key, None)


def _outermost_callees(frames: Sequence[Frame], frame: Frame) -> List[Frame]:
    """The captured sub-module frames inside `frame`'s module that no other
    captured sub-module inside it contains: replacing them hides the rest."""
    if frame.module is None:
        return []
    prefix = "" if frame.is_entry else frame.module_path + "."
    inside = [
        f for f in frames
        if f.module is not None and not f.is_entry and f is not frame and f.module_path.startswith(prefix)
    ]
    paths = [f.module_path for f in inside]
    return [f for f in inside if not any(f.module_path.startswith(q + ".") for q in paths if q != f.module_path)]


@contextlib.contextmanager
def submodule_callees_replaced(
    context: ScriptContext, frame: Frame, replacement: Callable[[Frame], torch.nn.Module]
) -> Iterator[None]:
    """Puts `replacement(callee)` in the place of each outermost captured
    sub-module inside `frame`'s module, for the duration of the block (an
    eager program, TorchScript or Python, is made with its callees so
    replaced)."""
    undo: List[Tuple[torch.nn.Module, str, torch.nn.Module]] = []
    try:
        for callee in _outermost_callees(context.frames, frame):
            parent_path, _, attr = callee.module_path.rpartition(".")
            parent = context.model.get_submodule(parent_path) if parent_path else context.model
            undo.append((parent, attr, parent._modules[attr]))
            parent._modules[attr] = replacement(callee)
        yield
    finally:
        for parent, attr, original in reversed(undo):
            parent._modules[attr] = original


@contextlib.contextmanager
def _patched(context: ScriptContext, stubs: _Stubs, frame: Frame) -> Iterator[None]:
    """Replaces captured callees of `frame` by their stubs."""
    undo: List[Callable[[], None]] = []
    try:
        with submodule_callees_replaced(context, frame, stubs.stub):
            for callee in stubs.frames:
                if callee.function is None or callee.is_entry:
                    continue
                name = callee.function.__name__
                for g in context.globals_sites.get(callee.name, []):
                    original = g[name]
                    g[name] = stubs.stub(callee)
                    undo.append(lambda g=g, name=name, original=original: g.__setitem__(name, original))
            yield
    finally:
        for fn in reversed(undo):
            fn()


def _script(context: ScriptContext, stubs: _Stubs, frame: Frame) -> torch.jit.ScriptModule:
    inexpressible = _inexpressible(frame)
    if inexpressible:
        raise PrecompileError(
            f"frame '{frame.name}' cannot be scripted for its eager program: {inexpressible}"
        )
    _clear_torchscript_caches()
    with _patched(context, stubs, frame), warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", FutureWarning)
        try:
            if frame.module is not None:
                scripted = torch.jit.script(frame.module)
            else:
                scripted = torch.jit.script(stubs.wrapper(frame))
        except Exception as e:  # noqa: BLE001 - TorchScript's reasons vary
            reason = "\n".join(str(e).strip().splitlines()[:12])
            raise PrecompileError(
                f"frame '{frame.name}' cannot be scripted for its eager program: "
                f"{type(e).__name__}: {reason}"
            ) from e
        finally:
            _clear_torchscript_caches()
    stubs.check_calls(frame, scripted)
    return scripted


def _return_structure(scripted: torch.jit.ScriptModule) -> Structure:
    returns = scripted.forward.schema.returns
    if len(returns) != 1:
        return None
    t = returns[0].type
    if isinstance(t, torch._C.TensorType):
        return (False, 1)
    if isinstance(t, torch._C.TupleType) and all(isinstance(e, torch._C.TensorType) for e in t.elements()):
        return (True, len(t.elements()))
    return None


def _check_schema(frame: Frame, scripted: torch.jit.ScriptModule) -> None:
    schema = scripted.forward.schema
    arguments = schema.arguments[1:]  # Without self.
    if [a.name for a in arguments] != [p.name for p in frame.params]:
        raise PrecompileError(
            f"frame '{frame.name}': its TorchScript forward takes {[a.name for a in arguments]}, "
            f"not the frame's parameters {[p.name for p in frame.params]}"
        )
    for a, p in zip(arguments, frame.params):
        kind = p.final_kind()
        if str(a.type) not in _SCHEMA_TYPES[kind]:
            raise PrecompileError(
                f"frame '{frame.name}': TorchScript types parameter '{p.name}' as {a.type} but the "
                f"capture saw {kind.value}; annotate it (unannotated parameters are Tensor to "
                "TorchScript)"
            )
    expected = frame.outputs.simple_structure() if frame.outputs is not None else None
    if expected is not None and _return_structure(scripted) != expected:
        raise PrecompileError(
            f"frame '{frame.name}': its TorchScript forward returns {schema.returns[0].type if schema.returns else 'nothing'}"
            f" but the frame returned {frame.outputs.describe()} when captured"
        )


def _structures(context: ScriptContext) -> Dict[str, Structure]:
    """Each frame's structure as a stub returns it; frames no call reached
    are learned from TorchScript."""
    structures: Dict[str, Structure] = {
        f.name: f.outputs.simple_structure() if f.outputs is not None else None for f in context.frames
    }
    unknown = [f for f in context.frames if f.outputs is None and not _inexpressible(f)]
    if unknown:
        # While learning, a frame never seen is taken to return one tensor.
        guesses = {f.name: (False, 1) if f.outputs is None else structures[f.name] for f in context.frames}
        stubs = _Stubs(context.frames, guesses)
        try:
            for frame in unknown:
                try:
                    structures[frame.name] = _return_structure(_script(context, stubs, frame))
                except PrecompileError:
                    pass
        finally:
            stubs.close()
    return structures


def check_scriptable(context: ScriptContext, frame: Frame) -> None:
    """Raises PrecompileError, with the ways out, if `frame` (just flagged)
    cannot get a TorchScript eager program."""
    ops.ensure_registered()
    stubs = _Stubs(context.frames, _structures(context))
    try:
        _check_schema(frame, _script(context, stubs, frame))
    except PrecompileError as e:
        raise PrecompileError(
            f"{e}\nFrame '{frame.name}' is flagged eager_fallback ({frame.fallback_cause.value}: "
            f"{frame.fallback_detail.splitlines()[0] if frame.fallback_detail else ''}), so the "
            "server must run the calls its variants miss as its eager program, here "
            f"TorchScript. {_WAYS_OUT}."
        ) from e
    finally:
        stubs.close()


def _loops(block: Any) -> Iterator[Any]:
    for node in block.nodes():
        if node.kind() == "prim::Loop":
            yield node
        for inner in node.blocks():
            yield from _loops(inner)


def _check_cancelled_in_loops(scripted: torch.jit.ScriptModule) -> None:
    """Starts every loop body with `precompile::check_cancelled()`.

    A loop's trip count may come from a request (`for _ in range(n)`), and
    nothing else interrupts a TorchScript program. The methods' calls are
    inlined first, so that loops in the functions and sub-module methods a
    method calls are checked too.
    """
    for module in scripted.modules():
        for name in module._c._method_names():
            graph = module._c._get_method(name).graph
            torch._C._jit_pass_inline(graph)
            for loop in list(_loops(graph)):
                body = next(iter(loop.blocks()))
                first = next(iter(body.nodes()), None) or body.returnNode()
                graph.create(ops.CHECK_CANCELLED, [], 0).insertBefore(first)


def build_eager_programs(context: ScriptContext, frames: Sequence[Frame], paths: Dict[str, str]) -> None:
    """Scripts each of `frames` and saves it to `paths[frame name]`."""
    ops.ensure_registered()
    stubs = _Stubs(context.frames, _structures(context))
    try:
        for frame in frames:
            scripted = _script(context, stubs, frame)
            _check_schema(frame, scripted)
            _check_cancelled_in_loops(scripted)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                warnings.simplefilter("ignore", FutureWarning)
                torch.jit.save(scripted, paths[frame.name])
    finally:
        stubs.close()
