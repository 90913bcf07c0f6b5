"""Python eager programs: a flagged frame as its own Python, for the server's
embedded interpreter.

TorchScript cannot express most of the Python that makes Dynamo give up
(`**kwargs`, dataclasses, logging, most of `transformers`). Such a frame can
instead be saved as a `precompile_eager.Program`: its module or function with
the module's weights. The outermost captured sub-modules inside the frame's
module, and the captured functions its code finds by name, are replaced, for
the pickling only, by `precompile_eager.FrameCall`s, which call the frame
through `precompile::call_frame`: the runtime dispatches them to their own
variants, and their weights are not saved twice.

Code travels two ways. Code an installed distribution provides (torch,
transformers, torchvision, ...) goes by reference, as pickle names it (module
and qualified name, imported from the server's Python environment). The
model's own code goes by value (cloudpickle): whatever no distribution
provides, i.e. a script's `__main__`, a notebook, classes and functions
defined inside a function, and modules that are only on `sys.path`. The
program then needs none of the user's files at the server, and serves the code
as it was when captured; the manifest lists that code per program (module,
qualified names, a hash of their source).

The manifest records what the programs import (top-level modules and the
versions of the distributions that provide them), found by loading each saved
program back and from the modules its by-value code refers to, and the Python
version, so that a server whose environment cannot run them refuses the model
at load with a message naming what lacks.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import importlib.metadata
import inspect
import io
import linecache
import marshal
import pickle
import platform
import sys
import types
import warnings
from typing import Any, Dict, Iterator, List, Optional, Sequence, Set, Tuple

import cloudpickle
import torch

import precompile_eager

from .eager import ScriptContext, submodule_callees_replaced
from .errors import PrecompileError
from .frames import EAGER_BINDINGS, Frame
# Modules the server has whatever the artifact: its own, and the standard
# library's.
_PROVIDED = {"precompile_eager", "builtins", "__builtin__"}


def _params(frame: Frame) -> List[precompile_eager.Param]:
    return [
        precompile_eager.Param(p.name, EAGER_BINDINGS[p.binding], p.has_default, p.default, p.tree, frame.trees.get(p.tree))
        for p in frame.params
    ]


def blocker(context: ScriptContext, frame: Frame) -> Optional[str]:
    """Why `frame` cannot get a Python eager program (known when it is
    flagged), or None."""
    for callee in _function_callees(context, frame):
        for site in context.globals_sites.get(callee.name, []):
            module = site.get("__name__", "")
            if not _by_value_module(module):
                # Its code would find the original function at the server,
                # and a global of an imported module cannot be replaced for
                # one model without replacing it for every model there.
                return (
                    f"its code calls function frame '{callee.name}' from module {module}, which an "
                    "installed distribution provides and which so travels by reference; capture "
                    "that callee as a sub-module, or use TorchScript"
                )
    return None


def _function_callees(context: ScriptContext, frame: Frame) -> List[Frame]:
    return [f for f in context.frames if f.function is not None and not f.is_entry and f is not frame]


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


class _Refused:
    """Stands in for a function frame a program cannot call (no example call
    reached it, or it returns more than tensors): harmless unless the
    program's code refers to it, which then fails the pickling."""

    def __init__(self, error: PrecompileError) -> None:
        self.error = error

    def __reduce__(self) -> Any:
        raise self.error


@contextlib.contextmanager
def _function_callees_replaced(context: ScriptContext, frame: Frame) -> Iterator[None]:
    """Binds each captured function's name, in the globals where the model's
    code finds it, to its `FrameCall` while the program is pickled: by-value
    code takes its globals from there. Only the pickle sees them."""
    undo: List[Tuple[Dict[str, Any], str, Any]] = []
    try:
        for callee in _function_callees(context, frame):
            try:
                stand_in: Any = _callee(callee, frame)
            except PrecompileError as e:
                stand_in = _Refused(e)
            name = callee.function.__name__
            for site in context.globals_sites.get(callee.name, []):
                undo.append((site, name, site[name]))
                site[name] = stand_in
        yield
    finally:
        for site, name, original in reversed(undo):
            site[name] = original


@functools.lru_cache(maxsize=None)
def _distributions() -> Dict[str, List[str]]:
    return importlib.metadata.packages_distributions()


def _by_value_module(module: str) -> bool:
    """Whether code of `module` travels by value: the model's own code, which
    no installed distribution (nor the standard library, nor the server)
    provides."""
    top = module.split(".")[0]
    if top == "__main__":
        return True
    if top in _PROVIDED or top in sys.stdlib_module_names or top in _distributions():
        return False
    loaded = sys.modules.get(top)
    if loaded is None:
        return False
    # Pure Python only (a namespace package has no file): an extension
    # module's classes cannot travel.
    file = getattr(loaded, "__file__", None)
    return file.endswith(".py") if file else hasattr(loaded, "__path__")


@dataclasses.dataclass(frozen=True)
class CodeByValue:
    """The code of one module that a program carries by value."""

    module: str
    qualified_names: Tuple[str, ...]
    # SHA-256 of the qualified names and their source (their compiled code
    # where Python has no source for them), in order.
    sha256: str


def _source(obj: Any) -> bytes:
    try:
        return inspect.getsource(obj).encode()
    except (OSError, TypeError):
        functions = [obj] if isinstance(obj, types.FunctionType) else [
            v for _, v in sorted(vars(obj).items()) if isinstance(v, types.FunctionType)]
        return b"".join(marshal.dumps(f.__code__) for f in functions)


class _Pickled:
    """What pickling a program met: the code it carried by value, and the
    modules it refers to by reference."""

    def __init__(self) -> None:
        self.by_value: Dict[str, Dict[str, Any]] = {}
        self.by_reference: Set[str] = set()

    def sources(self) -> Dict[str, str]:
        """The text of the files the by-value code was defined in (a
        notebook's cells too: IPython keeps them in linecache)."""
        out = {}
        for objects in self.by_value.values():
            for obj in objects.values():
                # Functions only: a class's methods are recorded as functions too.
                code = getattr(obj, "__code__", None)
                filename = code.co_filename if code is not None else None
                if filename and filename not in out:
                    text = "".join(linecache.getlines(filename))
                    if text:
                        out[filename] = text
        return out

    def code_by_value(self) -> List[CodeByValue]:
        out = []
        for module, objects in sorted(self.by_value.items()):
            # A class's methods travel with it: named once, by the class.
            names = tuple(sorted(n for n in objects if n.rpartition(".")[0] not in objects))
            digest = hashlib.sha256()
            for name in names:
                digest.update(name.encode() + b"\0" + _source(objects[name]) + b"\0")
            out.append(CodeByValue(module, names, digest.hexdigest()))
        return out


# Types cloudpickle names itself (types.CodeType, type(None), ...): neither
# the user's code nor a module's.
_NAMED_TYPES = {type(None), type(Ellipsis), type(NotImplemented), *cloudpickle.cloudpickle._BUILTIN_TYPE_NAMES}


def _pickle_module(pickled: _Pickled) -> Any:
    """A pickle module for torch.save whose Pickler is cloudpickle's,
    recording into `pickled`."""

    class Pickler(cloudpickle.Pickler):
        def reducer_override(self, obj: Any) -> Any:
            if isinstance(obj, (type, types.FunctionType, types.ModuleType)) and obj not in _NAMED_TYPES:
                module = (obj.__name__ if isinstance(obj, types.ModuleType) else obj.__module__) or ""
                # cloudpickle's own decision, so that what is recorded is what it does.
                if cloudpickle.cloudpickle._should_pickle_by_reference(obj):
                    pickled.by_reference.add(module)
                elif not isinstance(obj, types.ModuleType):
                    pickled.by_value.setdefault(module, {})[obj.__qualname__] = obj
            return super().reducer_override(obj)

    return types.SimpleNamespace(Pickler=Pickler, __name__="cloudpickle")


def _save(program: precompile_eager.Program) -> Tuple[bytes, _Pickled]:
    """`program` as torch.save writes it, the model's own modules by value.
    Which modules those are shows only while pickling (a by-value function's
    globals lead to more code), so it pickles until no new one appears."""
    registered: List[types.ModuleType] = []
    try:
        while True:
            pickled = _Pickled()
            buffer = io.BytesIO()
            torch.save(program, buffer, pickle_module=_pickle_module(pickled))
            new = sorted({m.split(".")[0] for m in pickled.by_reference if _by_value_module(m)}
                         - {m.__name__ for m in registered})
            if not new:
                sources = pickled.sources()
                if sources == program.sources:
                    return buffer.getvalue(), pickled
                program.sources = sources  # Text only: it brings no code along.
                continue
            for top in new:
                cloudpickle.register_pickle_by_value(sys.modules[top])
                registered.append(sys.modules[top])
    finally:
        for module in registered:
            cloudpickle.unregister_pickle_by_value(module)


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


@dataclasses.dataclass(frozen=True)
class SavedProgram:
    # The modules it imports when loaded.
    modules: Set[str]
    code_by_value: List[CodeByValue]


def build(context: ScriptContext, frame: Frame, path: str) -> SavedProgram:
    """Saves `frame`'s Python eager program to `path`."""
    reason = blocker(context, frame)
    if reason:
        raise PrecompileError(f"frame '{frame.name}' cannot get a Python eager program: {reason}")
    with submodule_callees_replaced(context, frame, lambda callee: _callee(callee, frame)), \
            _function_callees_replaced(context, frame):
        target = frame.module if frame.module is not None else frame.function
        program = precompile_eager.Program(frame.name, target, _params(frame))
        try:
            data, pickled = _save(program)
        except (pickle.PicklingError, AttributeError, TypeError) as e:
            raise PrecompileError(f"frame '{frame.name}' cannot be saved as a Python eager program: {e}") from e
    with open(path, "wb") as f:
        f.write(data)
    # Loading it back proves it loads, and names what torch's own reductions
    # import; by-value code imports its modules by name (cloudpickle's
    # subimport), which only the pickling saw.
    modules = _imported_modules(path) | pickled.by_reference
    return SavedProgram({m for m in modules if not _by_value_module(m)}, pickled.code_by_value())


def environment(modules: Set[str]) -> Tuple[str, List[Tuple[str, str]]]:
    """The Python version and the (top-level module, version) pairs the
    programs need, without the standard library."""
    tops = sorted({m.split(".")[0] for m in modules} - _PROVIDED - set(sys.stdlib_module_names))
    return platform.python_version(), [(m, precompile_eager.distribution_version(m)) for m in tops]


def build_all(
    context: ScriptContext, frames: Sequence[Frame], paths: Dict[str, str]
) -> Tuple[Tuple[str, List[Tuple[str, str]]], Dict[str, List[CodeByValue]]]:
    """Saves each of `frames`' programs to `paths[frame name]`; returns what
    they need of the server's Python (`environment`) and, per frame, the code
    its program carries by value."""
    modules: Set[str] = set()
    code: Dict[str, List[CodeByValue]] = {}
    for frame in frames:
        saved = build(context, frame, paths[frame.name])
        modules |= saved.modules
        code[frame.name] = saved.code_by_value
    return environment(modules), code
