"""Python eager programs: a flagged frame as its own Python, for the server's
embedded interpreter.

TorchScript cannot express most of the Python that makes Dynamo give up
(`**kwargs`, dataclasses, logging, most of `transformers`). Such a frame can
instead be saved as a `precompile_eager.Program`: its module or function by
reference (pickle names classes and functions by module and qualified name;
the server imports them from its own Python environment) with the module's
weights. The outermost captured sub-modules inside the frame's module are
replaced, for the pickling only, by `precompile_eager.FrameCall`s, which call
the frame through `precompile::call_frame`: the runtime dispatches them to
their own variants, and their weights are not saved twice.

The manifest records what the programs import (top-level modules and the
versions of the distributions that provide them), found by loading each saved
program back, and the Python version, so that a server whose environment
cannot run them refuses the model at load with a message naming what lacks.
"""

from __future__ import annotations

import io
import pickle
import platform
import sys
import warnings
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

import torch

import precompile_eager

from .eager import ScriptContext, submodule_callees_replaced
from .errors import PrecompileError
from .frames import Binding, Frame

_BINDINGS = {
    Binding.POSITIONAL_ONLY: precompile_eager.POSITIONAL_ONLY,
    Binding.POSITIONAL_OR_KEYWORD: precompile_eager.POSITIONAL_OR_KEYWORD,
    Binding.KEYWORD_ONLY: precompile_eager.KEYWORD_ONLY,
    Binding.VAR_POSITIONAL: precompile_eager.VAR_POSITIONAL,
    Binding.VAR_KEYWORD: precompile_eager.VAR_KEYWORD,
}
# Modules the server has whatever the artifact: its own, and the standard
# library's.
_PROVIDED = {"precompile_eager", "builtins", "__builtin__"}


def _params(frame: Frame) -> List[precompile_eager.Param]:
    return [precompile_eager.Param(p.name, _BINDINGS[p.binding], p.has_default, p.default) for p in frame.params]


def blocker(context: ScriptContext, frame: Frame) -> Optional[str]:
    """Why `frame` cannot get a Python eager program (known when it is
    flagged), or None."""
    functions = [f.name for f in context.frames if f.function is not None and not f.is_entry]
    if functions:
        # A function frame is reached through a global of the calling code,
        # which the server cannot replace for one model without replacing it
        # for every model in the process.
        return (
            f"the capture has function frames ({', '.join(functions)}), and a Python eager "
            "program routes only sub-module frames through the runtime's dispatcher"
        )
    return None


def _callee(frame: Frame, caller: Frame) -> precompile_eager.FrameCall:
    what = f"frame '{caller.name}' calls captured frame '{frame.name}'"
    if frame.outputs is None or frame.outputs.spec is None:
        raise PrecompileError(
            f"{what}, which no example call reached, so the structure it returns is unknown "
            "to its Python eager program; add an example call that reaches it"
        )
    for leaf in frame.outputs.leaves:
        if not leaf.is_tensor and leaf.python_type != "NoneType":
            raise PrecompileError(
                f"{what}, which returns a {leaf.python_type} at '{leaf.name}'; the runtime returns "
                "a frame's tensors only, so a Python eager program can rebuild only results whose "
                "other leaves are None"
            )
    return precompile_eager.FrameCall(
        frame.name, _params(frame), frame.outputs.spec, [leaf.is_tensor for leaf in frame.outputs.leaves]
    )


class _RecordingUnpickler(pickle.Unpickler):
    """Records the modules a pickle imports (torch.load subclasses it)."""

    modules: Set[str] = set()

    def find_class(self, module: str, name: str) -> Any:
        _RecordingUnpickler.modules.add(module)
        return super().find_class(module, name)


class _RecordingPickleModule:
    Unpickler = _RecordingUnpickler
    load = pickle.load
    __name__ = "pickle"


def _imported_modules(path: str) -> Set[str]:
    _RecordingUnpickler.modules = set()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # As precompile_eager.load.
        torch.load(path, map_location="cpu", weights_only=False, pickle_module=_RecordingPickleModule)
    return set(_RecordingUnpickler.modules)


def build(context: ScriptContext, frame: Frame, path: str) -> Set[str]:
    """Saves `frame`'s Python eager program to `path`; returns the modules
    it imports when loaded."""
    reason = blocker(context, frame)
    if reason:
        raise PrecompileError(f"frame '{frame.name}' cannot get a Python eager program: {reason}")
    with submodule_callees_replaced(context, frame, lambda callee: _callee(callee, frame)):
        target = frame.module if frame.module is not None else frame.function
        program = precompile_eager.Program(frame.name, target, _params(frame))
        buffer = io.BytesIO()
        try:
            torch.save(program, buffer)
        except (pickle.PicklingError, AttributeError, TypeError) as e:
            raise PrecompileError(
                f"frame '{frame.name}' cannot be saved as a Python eager program, which refers to "
                f"its code by module and name: {e}. Define the model's classes and functions at "
                "the top level of an importable module"
            ) from e
    with open(path, "wb") as f:
        f.write(buffer.getvalue())
    modules = _imported_modules(path)
    main = sorted(m for m in modules if m == "__main__" or m.startswith("__main__."))
    if main:
        raise PrecompileError(
            f"frame '{frame.name}' cannot be saved as a Python eager program: it refers to code "
            "defined in __main__, which the server cannot import; move it into an importable module"
        )
    return modules


def environment(modules: Set[str]) -> Tuple[str, List[Tuple[str, str]]]:
    """The Python version and the (top-level module, version) pairs the
    programs need, without the standard library."""
    tops = sorted({m.split(".")[0] for m in modules} - _PROVIDED - set(sys.stdlib_module_names))
    return platform.python_version(), [(m, precompile_eager.distribution_version(m)) for m in tops]


def build_all(context: ScriptContext, frames: Sequence[Frame], paths: Dict[str, str]) -> Tuple[str, List[Tuple[str, str]]]:
    """Saves each of `frames`' programs to `paths[frame name]`; returns what
    they need of the server's Python (`environment`)."""
    modules: Set[str] = set()
    for frame in frames:
        modules |= build(context, frame, paths[frame.name])
    return environment(modules)
