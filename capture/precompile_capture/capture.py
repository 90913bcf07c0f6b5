"""Capturing a program: run it on example calls and record what Dynamo does.

Every call of a frame is handled as Dynamo would handle it (with strict
torch.export as the tracer and AOTInductor as the backend):

- a frame Dynamo gave up on (flagged `eager_fallback`), or one whose compile
  error `suppress_errors` swallowed, runs eagerly; the capture records nothing
  more for it, but the frames it calls are still captured on their own;
- a call an existing variant's guards hold for runs eagerly without seeing the
  frames it calls (the compiled variant inlines them);
- any other call is a miss: past the recompile limit the frame is truncated,
  otherwise it is exported (static on the first capture, dimensions that
  changed since become dynamic), its guards are read off the exported program
  and AOTInductor compiles it into a new variant; a failure Dynamo falls back
  on flags the frame (which must then get an eager program: it is scripted at
  once, so that one that cannot be is reported at this call), and the call
  runs eagerly, seeing its callees.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import inspect
import itertools
import os
import shutil
import tempfile
import warnings
import weakref
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import torch

from . import ops, outputs, python_program
from .eager import ScriptContext, build_eager_programs, check_scriptable
from .errors import PrecompileError
from .frames import Frame, FrameInfo, Variant
from .compiling import CompileError, Fallback, VariantCompiler
from .guards import DTYPE_NAMES, relation_holds
from .summary import ALL_CAUSES_IN_WORDS, FallbackCause, PrecompileSummary

if TYPE_CHECKING:
    from .artifact import ArtifactContents

DEVICES = ("cpu", "cuda")
EAGER_PROGRAMS = ("auto", "torchscript", "python")


def call_record(frame: Frame, values: Sequence[Any]) -> Dict[str, Any]:
    """What a call's signature needs of its inputs, never their data: per
    input by name ("tensor", dtype, device type, shape) or ("value", the
    value). By name, as inputs are added later (an entry of **kwargs, a
    structure's leaves)."""
    return {
        p.name: ("tensor", v.dtype, v.device.type, tuple(int(s) for s in v.shape))
        if isinstance(v, torch.Tensor)
        else ("value", v)
        for p, v in zip(frame.params, values)
    }


def _describe_call(values: Sequence[Any], frame: Frame) -> str:
    """The call's arguments, None ones left out (a transformers model has a
    dozen a call leaves None)."""
    parts = []
    for p, v in zip(frame.params, values):
        if v is None:
            continue
        if isinstance(v, torch.Tensor):
            dims = ", ".join(str(s) for s in v.shape)
            where = "" if v.device.type == "cpu" else f" on {v.device.type}"
            parts.append(f"{p.name}={DTYPE_NAMES.get(v.dtype, str(v.dtype))}[{dims}]{where}")
        else:
            parts.append(f"{p.name}={v!r}")
    return f"{frame.name}({', '.join(parts)})"


def _stand_in(value: Any, rows: Optional[int] = None) -> Any:
    """A tensor of `value`'s dtype, device and shape (its first dimension
    `rows`, where given) whose elements all share one: what guards read."""
    if not isinstance(value, torch.Tensor):
        return value
    shape = list(value.shape)
    if rows is not None:
        shape[0] = rows
    return torch.empty_strided(shape, [0] * len(shape), dtype=value.dtype, device=value.device)


def size_steps(variants: Sequence[Any], values: List[Any], names: Sequence[str],
               probe: int = 64) -> List[str]:
    """The dynamic sizes of a call (`values`, one per parameter) that the
    variant serving it takes at the call's size but not at some sizes above
    it: a shape guard of the model's code on that size alone keeps a parity
    or a multiple of it (pooling with ceil_mode, patches). Each as
    "x.size(2) at 96 and next at 128 (97 to 127 are refused)" or "x.size(3)
    at 80 to 94, then at none of 95 to 110, next at 111", probing up to
    `probe` more; the sizes below the call's refused past its range's; and
    a top of the range that the model's code set ("x.size(2) up to 8 and at
    none above"). Per size symbol past the first dimension (the batch: Capture.
    batch_gaps), by its range and the guards on it alone: guards relating it
    to other sizes ask those to move with it, which is not a step."""
    serving = next((v for v in variants if v.guards.holds(values)), None)
    if serving is None:
        return []
    guards = serving.guards
    ranges = {r.symbol: r for r in guards.symbols}
    ceilings = dict(guards.code_ceilings)
    first: Dict[int, Tuple[int, int, int]] = {}  # symbol -> (parameter, dimension, its value)
    batch = set()
    for arg in guards.args:
        for d, dim in enumerate(arg.tensor.dims if arg.tensor is not None else ()):
            if dim.symbol is None:
                continue
            if d == 0:
                batch.add(dim.symbol)
            first.setdefault(dim.symbol, (arg.parameter, d, values[arg.parameter].shape[d] - dim.offset))
    alone: Dict[int, List[Any]] = {}
    for relation in guards.size_relations:
        symbols = {value for kind, value in relation.left + relation.right if kind == "symbol"}
        if len(symbols) == 1:
            alone.setdefault(symbols.pop(), []).append(relation)

    def takes(symbol: int, value: int) -> bool:
        r = ranges[symbol]
        if value < r.min or (r.max is not None and value > r.max):
            return False
        return all(relation_holds(relation, {symbol: value}) for relation in alone.get(symbol, []))

    steps = []
    for symbol, (i, d, value) in sorted(first.items()):
        if symbol in batch:
            continue
        size = values[i].shape[d]
        offset = size - value
        name = f"{names[i]}.size({d})"
        if not takes(symbol, value + 1):
            step = next((k for k in range(2, probe + 1) if takes(symbol, value + k)), None)
            if step is None:
                steps.append(f"{name} at {size} and at none of {size + 1} to {size + probe}")
            else:
                refused = f"{size + 1} is" if step == 2 else f"{size + 1} to {size + step - 1} are"
                steps.append(f"{name} at {size} and next at {size + step} ({refused} refused)")
        else:
            # Served in runs: a parity of the size after floor divisions
            # (AlexNet's and VGG's pooling) takes a run of sizes, then
            # refuses the next. Refusals past the range's top are not steps.
            top = probe if ranges[symbol].max is None else min(probe, ranges[symbol].max - value)
            gap = next((k for k in range(2, top + 1) if not takes(symbol, value + k)), None)
            if gap is not None:
                resume = next((k for k in range(gap + 1, probe + 1) if takes(symbol, value + k)), None)
                steps.append(
                    f"{name} at {size} to {size + gap - 1}, then at none of {size + gap} to "
                    + (f"{size + resume - 1}, next at {size + resume}" if resume is not None
                       else f"{size + probe}"))
        # Below: the smallest size served, where guards on the size alone
        # refuse more than its range says (a side of 32 pixels or fewer that
        # pools to nothing). Not "from there up": the steps above may refuse
        # sizes past the call as well.
        lowest = ranges[symbol].min
        smallest = next((v for v in range(lowest, value) if takes(symbol, v)), value)
        if smallest > lowest and value - lowest <= 4096:
            steps.append(f"{name} at none of {lowest + offset} to {smallest + offset - 1}")
        # Above: a top of the range that the model's code set (a size
        # computed from this one taken as 1 up to there), not a table's
        # length or --max-size, which say why themselves.
        ceiling = ceilings.get(symbol)
        if ceiling is not None and ranges[symbol].max == ceiling and value < ceiling < 1 << 31:
            steps.append(f"{name} up to {ceiling + offset} and at none above")
    return steps


class _Interceptor:
    """Routes calls of sub-frames through the capture while frames run eagerly.

    Installed only while a frame runs eagerly with interception: a wrapper as
    each captured sub-module's instance `forward`, and in place of each
    captured function in the globals of the code that calls it. Never
    installed while exporting, compiling or running a frame that a variant
    covers.
    """

    def __init__(self, capture: "Capture") -> None:
        self._capture = capture
        self.active = False
        self._restore: List[Callable[[], None]] = []

    def _install(self) -> None:
        restore: List[Callable[[], None]] = []
        for frame in self._capture._frames.values():
            if frame.is_entry:
                continue
            wrapper = self._capture._wrapper_for(frame)
            if frame.module is not None:
                module = frame.module
                had = "forward" in module.__dict__
                previous = module.__dict__.get("forward")
                module.__dict__["forward"] = wrapper

                def undo(module=module, had=had, previous=previous) -> None:
                    if had:
                        module.__dict__["forward"] = previous
                    else:
                        module.__dict__.pop("forward", None)

                restore.append(undo)
            else:
                for g in self._capture._globals_sites(frame):
                    original = g[frame.function.__name__]
                    g[frame.function.__name__] = wrapper
                    restore.append(lambda g=g, original=original, name=frame.function.__name__: g.__setitem__(name, original))
        self._restore = restore

    def _uninstall(self) -> None:
        for undo in reversed(self._restore):
            undo()
        self._restore = []

    def set(self, active: bool) -> None:
        if active == self.active:
            return
        if active:
            self._install()
        else:
            self._uninstall()
        self.active = active

    @contextlib.contextmanager
    def state(self, active: bool) -> Iterator[None]:
        previous = self.active
        self.set(active)
        try:
            yield
        finally:
            self.set(previous)


def _checked_size_limits(max_sizes: Mapping[str, Mapping[Optional[int], int]],
                         entry: Frame) -> Dict[str, Dict[Optional[int], int]]:
    names = {p.name for p in entry.params}
    limits: Dict[str, Dict[Optional[int], int]] = {}
    for name, dims in max_sizes.items():
        if name not in names and entry.var_keyword is None:
            raise PrecompileError(
                f"max_sizes names '{name}', which is not a parameter of the entry frame '{entry.name}' "
                f"(its parameters: {', '.join(sorted(names)) or 'none'})")
        for dim, size in dims.items():
            if (dim is not None and (not isinstance(dim, int) or dim < 0)) or not isinstance(size, int) or size < 1:
                raise PrecompileError(
                    f"max_sizes for '{name}': dimension {dim!r} at most {size!r}; a dimension is an index "
                    "from 0 (or None for every one) and a size at least 1")
        limits[name] = dict(dims)
    return limits


class Capture:
    """A program under capture: `capture(model_or_fn, name=...)` starts one.

    Call the returned object as you would call the program; every call runs
    (eagerly, under torch.no_grad()) and is recorded as Dynamo would record it.
    Then `summary()` says what is covered and `save(directory)` writes the
    artifact.

    Args:
      model_or_fn: an nn.Module (entry frame "forward") or a Python function
        (entry frame named by its __name__).
      name: the model's name in the artifact.
      device: "cpu" or "cuda"; the device the variants are compiled for (the
        model and inputs must be on it).
      frames: sub-frames: a sub-module path ("encoder", "blocks.0"), a
        sub-module, or a function (frame named by its __name__, which must be
        unique and bound to that name in the calling code's globals).
      recompile_limit: variants per frame; a miss beyond it truncates the frame.
      suppress_errors: a compile error runs the call eagerly and leaves the
        frame uncovered instead of raising PrecompileError.
      decline: called with each exported program before it is compiled; raising
        torch._dynamo.exc.SkipFrame declines it (the frame falls back to eager,
        cause BACKEND_SKIP); any other exception is a compile error.
      eager: the eager programs of flagged frames: "torchscript" (nothing but
        libtorch at serve time), "python" (the frame's own Python, run by the
        server's embedded interpreter: see python_program.py), or "auto"
        (default): TorchScript when the frame scripts, else Python.
      dynamic: as torch.compile's: None (default), Dynamo's automatic dynamic
        shapes (a dimension seen at two sizes becomes dynamic at the next
        compile); False, never dynamic: each new shape compiles a static
        variant (a server padding merged batches up to one of their batch
        sizes, say). True is not offered: Dynamo's marks every dimension
        dynamic, including sizes the model needs fixed.
      max_sizes: per tensor parameter of the entry frame, per dimension
        (None: every dimension), the largest size its variants take: a
        dynamic size is otherwise unbounded, and compiled code runs at
        whatever size a client sends (one 2048x2048 image can hold a core
        for a minute). The server refuses a larger call, or runs it eagerly
        where the frame is flagged. An example call past a limit is an error.
    """

    def __init__(
        self,
        model_or_fn: Union[torch.nn.Module, Callable[..., Any]],
        *,
        name: str,
        device: str = "cpu",
        frames: Sequence[Union[str, Callable[..., Any], torch.nn.Module]] = (),
        recompile_limit: int = 8,
        suppress_errors: bool = False,
        decline: Optional[Callable[[torch.export.ExportedProgram], Any]] = None,
        eager: str = "auto",
        dynamic: Optional[bool] = None,
        max_sizes: Optional[Mapping[str, Mapping[Optional[int], int]]] = None,
    ) -> None:
        if dynamic not in (None, False):
            raise PrecompileError(f"dynamic must be None (automatic) or False (static), not {dynamic!r}")
        self.static_shapes = dynamic is False
        if not name or not isinstance(name, str):
            raise PrecompileError("a capture needs a model name")
        if device not in DEVICES:
            raise PrecompileError(f"device must be one of {DEVICES}, not {device!r}")
        if recompile_limit < 1:
            raise PrecompileError(f"recompile_limit must be at least 1, not {recompile_limit}")
        if eager not in EAGER_PROGRAMS:
            raise PrecompileError(f"eager must be one of {EAGER_PROGRAMS}, not {eager!r}")
        ops.ensure_registered()
        self.eager = eager
        self.name = name
        self.device = device
        self.recompile_limit = recompile_limit
        self.suppress_errors = suppress_errors
        self.model = model_or_fn
        self._frames: Dict[str, Frame] = {}
        self._wrappers: Dict[str, Callable[..., Any]] = {}
        self._code_globals_cache: Optional[List[Dict[str, Any]]] = None
        if isinstance(model_or_fn, torch.nn.Module):
            entry = Frame("forward", is_entry=True, module=model_or_fn)
        elif callable(model_or_fn) and hasattr(model_or_fn, "__name__") and hasattr(model_or_fn, "__code__"):
            entry = Frame(model_or_fn.__name__, is_entry=True, function=model_or_fn)
        else:
            raise PrecompileError(
                f"capture() takes an nn.Module or a Python function, not {type(model_or_fn).__name__}"
            )
        self.entry = entry
        self._frames[entry.name] = entry
        entry.size_limits = _checked_size_limits(max_sizes or {}, entry)
        for spec in frames:
            frame = self._make_subframe(spec)
            if frame.name in self._frames:
                raise PrecompileError(f"two frames are named '{frame.name}'; frame names must be unique")
            self._frames[frame.name] = frame
        for frame in self._frames.values():
            if frame.function is not None and not frame.is_entry and not self._globals_sites(frame):
                raise PrecompileError(
                    f"function frame '{frame.name}' is not called by name from the code of the "
                    "model (no global of that name refers to it), so its calls cannot be captured"
                )
        self._interceptor = _Interceptor(self)
        self._workdir = tempfile.mkdtemp(prefix="precompile-capture-")
        self._cleanup = weakref.finalize(self, shutil.rmtree, self._workdir, True)
        # Calls are numbered from 0, as a calls file's list and its
        # "output_of" number them.
        self._call_counter = itertools.count(0)
        self._compiler = VariantCompiler(
            self._workdir, decline, lambda: self._interceptor.state(False), static=dynamic is False
        )
        # The entry calls that ran, in order (call_record()); the manifest's
        # captured_calls, each signature once.
        self._entry_calls: List[Dict[str, Any]] = []
        # Each example call's entry values, tensors as empty stand-ins of
        # their shapes (stride 0: no memory), for batch_gaps().
        self._entry_shapes: List[List[Any]] = []
        for frame in self._frames.values():
            ops.register_frame(frame.name, frame.call_original)

    # -- frames ------------------------------------------------------------------

    def _make_subframe(self, spec: Any) -> Frame:
        if isinstance(spec, str):
            if not isinstance(self.model, torch.nn.Module):
                raise PrecompileError(
                    f"sub-frame '{spec}' names a sub-module, but the entry is a function"
                )
            if not spec:
                raise PrecompileError("a sub-frame path is empty (the entry frame is captured anyway)")
            try:
                module = self.model.get_submodule(spec)
            except AttributeError as e:
                raise PrecompileError(f"sub-frame '{spec}': the model has no such sub-module ({e})") from e
            return Frame(spec, is_entry=False, module=module, module_path=spec)
        if isinstance(spec, torch.nn.Module):
            if not isinstance(self.model, torch.nn.Module):
                raise PrecompileError("a sub-module frame needs a module entry")
            for path, module in self.model.named_modules():
                if module is spec and path:
                    return Frame(path, is_entry=False, module=module, module_path=path)
            raise PrecompileError(f"sub-frame {type(spec).__name__} is not a sub-module of the model")
        if inspect.isfunction(spec):
            return Frame(spec.__name__, is_entry=False, function=spec)
        raise PrecompileError(
            f"a sub-frame is a sub-module path or a Python function, not {type(spec).__name__}"
        )

    def _code_globals(self) -> List[Dict[str, Any]]:
        """The globals of every piece of code that may call a function frame."""
        if self._code_globals_cache is not None:
            return self._code_globals_cache
        sites: List[Dict[str, Any]] = []
        seen: set = set()

        def add(fn: Any) -> None:
            fn = inspect.unwrap(fn) if callable(fn) else fn
            g = getattr(fn, "__globals__", None)
            if g is not None and id(g) not in seen:
                seen.add(id(g))
                sites.append(g)

        if isinstance(self.model, torch.nn.Module):
            for module in self.model.modules():
                add(type(module).forward)
        for frame in self._frames.values():
            if frame.function is not None:
                add(frame.function)
        self._code_globals_cache = sites
        return sites

    def _globals_sites(self, frame: Frame) -> List[Dict[str, Any]]:
        """Globals dicts in which `frame`'s function is bound to its own name."""
        name = frame.function.__name__
        wrapper = self._wrappers.get(frame.name)
        out = []
        for g in self._code_globals():
            current = g.get(name)
            if current is not None and (current is frame.function or current is wrapper):
                out.append(g)
        return out

    def _wrapper_for(self, frame: Frame) -> Callable[..., Any]:
        wrapper = self._wrappers.get(frame.name)
        if wrapper is None:
            capture_ref = weakref.ref(self)

            @functools.wraps(frame.code)
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                cap = capture_ref()
                if cap is None:  # The capture is gone: behave as the original.
                    return frame.call_original(*args, **kwargs)
                return cap._dispatch(frame, args, kwargs)

            self._wrappers[frame.name] = wrapper
        return wrapper

    # -- calls ---------------------------------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Runs the program as the user would (under no_grad), capturing it.

        The call's signature is recorded for the manifest's captured_calls once
        the call has run: a recapture replays those calls, so one that raised
        is left out (replaying it would raise again)."""
        with torch.no_grad():
            values = self._bind(self.entry, args, kwargs)
            result = self._dispatch_bound(self.entry, args, kwargs, values)
        self._entry_calls.append(call_record(self.entry, values))
        self._entry_shapes.append([_stand_in(v) for v in values])
        return result

    def _run_eager(self, frame: Frame, args: Tuple[Any, ...], kwargs: Dict[str, Any], intercept: bool) -> Any:
        with self._interceptor.state(intercept):
            result = frame.call_original(*args, **kwargs)
        frame.observe_result(result)
        return result

    def _bind(self, frame: Frame, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> List[Any]:
        """The call's inputs in the frame's order, as the guards see them."""
        values = frame.bind(args, kwargs)
        frame.observe(values)
        return frame.normalize(values)

    def _dispatch(self, frame: Frame, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
        return self._dispatch_bound(frame, args, kwargs, self._bind(frame, args, kwargs))

    def _dispatch_bound(
        self, frame: Frame, args: Tuple[Any, ...], kwargs: Dict[str, Any], values: List[Any]
    ) -> Any:
        frame.calls += 1
        call_number = next(self._call_counter)
        if frame.skipped:
            return self._run_eager(frame, args, kwargs, intercept=True)
        for variant in frame.variants:
            if variant.guards.holds(values):
                return self._run_eager(frame, args, kwargs, intercept=False)
        if len(frame.variants) >= self.recompile_limit:
            frame.truncated = True
            return self._run_eager(frame, args, kwargs, intercept=True)
        self._check_devices(frame, values)
        try:
            try:
                self._compile(frame, values, call_number)
            except CompileError:
                if frame.outputs is not None:
                    raise
                # Outputs the capture cannot serve fail the export less clearly:
                # run the call to say which (PrecompileError). A dataclass
                # or a known library structure among them becomes a pytree
                # node then; export once more.
                registered = len(outputs.registered_nodes)
                with self._interceptor.state(False):
                    frame.observe_result(frame.call_original(*args, **kwargs))
                if len(outputs.registered_nodes) == registered:
                    raise
                self._compile(frame, values, call_number)
            except Fallback as fb:
                if not self._set_up_by_a_first_call(frame, fb, args, kwargs):
                    raise
                self._compile(frame, values, call_number)
        except Fallback as fb:
            frame.flag(fb.cause, fb.detail, fb.error_type)
            if not frame.variantless_entry_fallback:
                with self._interceptor.state(False):
                    frame.eager_program = self._choose_eager_program(frame)
        except CompileError as e:
            if not self.suppress_errors:
                refused = self._eager_failure(frame, args, kwargs)
                if refused is not None:
                    raise PrecompileError(
                        f"frame '{frame.name}': capturing {_describe_call(values, frame)} failed, and the "
                        f"call fails in eager too ({type(refused).__name__}: {str(refused).splitlines()[0]}): "
                        "an example call the model itself refuses; drop it or fix its inputs"
                    ) from refused
                raise PrecompileError(
                    f"frame '{frame.name}': {e} (capturing {_describe_call(values, frame)}; "
                    "pass suppress_errors=True (command line: --suppress-errors --allow-incomplete) "
                    "to run such calls eagerly and leave the frame uncovered; a compile that fails "
                    "only for dynamic sizes may pass with dynamic=False (--static-shapes))"
                ) from e.error
            frame.compile_error = str(e)
            warnings.warn(
                f"precompile capture: frame '{frame.name}': {e}; suppressed, the frame runs "
                "eagerly and stays uncovered unless an earlier variant covers a call",
                RuntimeWarning,
                stacklevel=2,
            )
        else:
            result = self._run_eager(frame, args, kwargs, intercept=False)
            self._check_variant_outputs(frame, frame.variants[-1])
            return result
        return self._run_eager(frame, args, kwargs, intercept=True)

    def _run_on_copies(self, frame: Frame, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> bool:
        """Runs `frame` eagerly, uncaptured, on copies of the call's inputs
        (a cache among them is not extended twice); False, without running,
        where the inputs cannot be copied. What the frame raises propagates."""
        try:
            copied = copy.deepcopy((args, kwargs))
        except Exception:  # noqa: BLE001 - inputs that cannot be copied: not run
            return False
        with self._interceptor.state(False):
            frame.call_original(*copied[0], **copied[1])
        return True

    def _eager_failure(self, frame: Frame, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Optional[Exception]:
        """What the call raises in eager; None if it runs (or its inputs
        cannot be copied). A compile that failed on an example call eager
        refuses too is the call's fault, which Dynamo's message only hints
        at."""
        try:
            self._run_on_copies(frame, args, kwargs)
        except Exception as e:  # noqa: BLE001 - whatever the model raises is the answer
            return e
        return None

    def _set_up_by_a_first_call(self, frame: Frame, fallback: Fallback, args: Tuple[Any, ...],
                                kwargs: Dict[str, Any]) -> bool:
        """Whether `frame`, whose first trace broke the graph, has now run
        once eagerly, so that its trace may be tried again.

        Code that sets itself up on its first call can break the graph only
        then: transformers installs its output-capturing hooks on the first
        call that asks for hidden states or attentions, under a lock Dynamo
        cannot trace, and BERT called with output_hidden_states=True fell
        back to eager for good."""
        if fallback.cause is not FallbackCause.GRAPH_BREAK or frame.variants or frame.calls != 1:
            return False
        return self._run_on_copies(frame, args, kwargs)

    def _choose_eager_program(self, frame: Frame) -> str:
        """The kind of eager program `frame` (just flagged) gets, or
        PrecompileError, with the ways out, when it can get none."""
        context = self._script_context()
        if self.eager != "python":
            try:
                check_scriptable(context, frame)
                return "torchscript"
            except PrecompileError as scripting:
                if self.eager == "torchscript":
                    raise
                failure: Optional[PrecompileError] = scripting
        else:
            failure = None
        reason = python_program.blocker(context, frame)
        if reason is None:
            return "python"
        message = (
            f"frame '{frame.name}' is flagged eager_fallback ({frame.fallback_cause.value}), so the "
            f"server must run the calls its variants miss, but it cannot get a Python eager program: "
            f"{reason}"
        )
        if failure is not None:
            raise PrecompileError(f"{failure}\nNor {message[0].lower()}{message[1:]}") from failure
        raise PrecompileError(message)

    def _check_variant_outputs(self, frame: Frame, variant: Variant) -> None:
        assert frame.outputs is not None
        kinds = tuple(leaf.is_tensor for leaf in frame.outputs.leaves)
        if variant.leaf_kinds != kinds:
            raise PrecompileError(
                f"frame '{frame.name}': variant {variant.id} returns {len(variant.leaf_kinds)} "
                f"values ({sum(variant.leaf_kinds)} tensors) but the frame returns "
                f"{frame.outputs.describe()}"
            )

    def _check_devices(self, frame: Frame, values: List[Any]) -> None:
        for p, v in zip(frame.params, values):
            if isinstance(v, torch.Tensor) and v.device.type != self.device:
                raise PrecompileError(
                    f"frame '{frame.name}', parameter '{p.name}': a {v.device.type} tensor in a "
                    f"capture for device '{self.device}'; move the model and its inputs to "
                    f"{self.device}"
                )

    def _compile(self, frame: Frame, values: List[Any], call_number: int) -> None:
        captured_from = f"call {call_number}: {_describe_call(values, frame)}"
        frame.variants.append(self._compiler.compile(frame, values, captured_from))

    @property
    def compile_log(self) -> List[Tuple[str, str, float]]:
        """(frame, variant id, seconds) of every AOTInductor compile."""
        return self._compiler.compile_log

    @property
    def export_count(self) -> int:
        """How many times a frame was exported (each compile, each retry)."""
        return self._compiler.export_count

    # -- results ---------------------------------------------------------------------

    @property
    def frame_names(self) -> Tuple[str, ...]:
        return tuple(self._frames)

    def frame(self, name: str) -> FrameInfo:
        f = self._frames[name]
        names = [p.name for p in f.params]
        return FrameInfo(
            name=f.name,
            is_entry=f.is_entry,
            parameters=tuple((p.name, p.final_kind().value) for p in f.params),
            outputs=f.outputs.tensor_names if f.outputs is not None else (),
            variants=tuple((v.id, v.guards.describe(names, self.device)) for v in f.variants),
            eager_fallback=f.eager_fallback,
            fallback_cause=f.fallback_cause,
            fallback_detail=f.fallback_detail,
            fallback_exception=f.fallback_exception,
            truncated=f.truncated,
            variantless_entry_fallback=f.variantless_entry_fallback,
            compile_error=f.compile_error,
            calls=f.calls,
        )

    def summary(self) -> PrecompileSummary:
        frames = list(self._frames.values())
        eager = tuple(f.name for f in frames if f.eager_fallback and not f.variantless_entry_fallback)
        # A frame whose compile error was suppressed is uncovered even with
        # variants: the calls after the error were not captured (Dynamo
        # skips the frame), and no eager program serves them.
        uncovered = tuple(
            f.name for f in frames
            if (not f.variants and (not f.eager_fallback or f.variantless_entry_fallback))
            or (f.compile_error and not f.eager_fallback)
        )
        truncated = any(f.truncated for f in frames)
        return PrecompileSummary(
            frames=tuple(f.name for f in frames),
            variants_per_frame={f.name: len(f.variants) for f in frames},
            eager_fallbacks=eager,
            uncovered_frames=uncovered,
            truncated=truncated,
            complete=not uncovered and not truncated,
        )

    def _entry_calls_to_check(self) -> List[Tuple[int, List[Any]]]:
        """The example calls' shapes (numbered, one value per parameter of the
        entry) that the save() warnings check the variants against; none
        where what they warn of is meant or served: with static shapes
        (dynamic=False, every shape its own variant), or an entry that falls
        back (it serves them eagerly)."""
        entry = self.entry
        if self.static_shapes or entry.eager_fallback or not entry.variants:
            return []
        # Inputs a later call added (an entry of **kwargs): None in earlier ones.
        return [(number, values + [None] * (len(entry.params) - len(values)))
                for number, values in enumerate(self._entry_shapes)]

    def batch_gaps(self) -> List[str]:
        """Example calls whose shapes the variants serve at the call's batch
        (the first dimension its tensors share) but not at batch 1 or at one
        more: Dynamo's guards keep what the calls had, so a size the example
        calls never varied stays as it was (batch 1 is its own case: Dynamo
        makes a dynamic size start at 2), and a guard the code asks for
        (a parity, a size its shortcut takes) excludes others. One line per
        shape, naming the batches (none where _entry_calls_to_check says)."""
        entry = self.entry

        def served(values: List[Any]) -> bool:
            return any(v.guards.holds(values) for v in entry.variants)

        gaps, seen = [], set()
        with torch.no_grad():
            for number, values in self._entry_calls_to_check():
                tensors = [v for v in values if isinstance(v, torch.Tensor) and v.dim() > 0]
                if not tensors or not served(values):
                    continue
                rows = tensors[0].shape[0]
                batched = [isinstance(v, torch.Tensor) and v.dim() > 0 and v.shape[0] == rows for v in values]
                shapes = tuple((tuple(v.shape[1:]) if b else tuple(v.shape)) if isinstance(v, torch.Tensor)
                               else None for v, b in zip(values, batched))
                if shapes in seen:
                    continue
                seen.add(shapes)
                missed = [other for other in sorted({1, rows + 1} - {rows})
                          if not served([_stand_in(v, other) if b else v for v, b in zip(values, batched)])]
                if missed:
                    gaps.append(f"call {number}, {_describe_call(values, entry)}, at batch "
                                f"{' or '.join(str(m) for m in missed)}")
        return gaps

    def operators(self) -> Dict[str, str]:
        """The operators outside ATen that the variants' compiled code calls,
        each with the module that defines it in Python ("" for none)."""
        from .called_operators import defining_modules  # noqa: PLC0415

        return defining_modules(op for f in self._frames.values() for v in f.variants for op in v.operators)

    def size_steps(self) -> List[str]:
        """Per example call, its dynamic sizes that no variant serves at one
        more (module-level size_steps; none where _entry_calls_to_check says)."""
        entry = self.entry
        names = [p.name for p in entry.params]
        lines, seen = [], set()
        with torch.no_grad():
            for number, values in self._entry_calls_to_check():
                steps = size_steps(entry.variants, values, names)
                if steps and tuple(steps) not in seen:
                    seen.add(tuple(steps))
                    lines.append(f"call {number}, {_describe_call(values, entry)}: {'; '.join(steps)}")
        return lines

    def static_sizes(self) -> List[str]:
        """Sizes of the entry's tensors that the example calls varied and that
        every variant still takes as one fixed size: Dynamo specialized them
        (the model's code used the size as a Python number: a loop's trip
        count, a shape it computed with), so only the sizes the calls had
        are served. One line per dimension, naming the sizes seen (none
        where _entry_calls_to_check says)."""
        entry = self.entry
        # Per (parameter, rank, dimension): the sizes the calls had.
        seen: Dict[Tuple[int, int, int], List[int]] = {}
        for _, values in self._entry_calls_to_check():
            for i, v in enumerate(values):
                if isinstance(v, torch.Tensor):
                    for d, size in enumerate(v.shape):
                        sizes = seen.setdefault((i, v.dim(), d), [])
                        if size not in sizes:
                            sizes.append(size)

        def fixed(i: int, rank: int, d: int) -> bool:
            """Some variant takes the parameter at this rank, and none with
            this dimension dynamic."""
            specs = [arg.tensor for v in entry.variants for arg in v.guards.args
                     if arg.parameter == i and arg.tensor is not None and len(arg.tensor.dims) == rank]
            return bool(specs) and all(spec.dims[d].symbol is None for spec in specs)

        return [f"{entry.params[i].name}.size({d}) ({', '.join(str(s) for s in sorted(sizes))})"
                for (i, rank, d), sizes in sorted(seen.items()) if len(sizes) > 1 and fixed(i, rank, d)]

    def variantless_entry_message(self) -> Optional[str]:
        entry = self.entry
        if not entry.variantless_entry_fallback:
            return None
        assert entry.fallback_cause is not None
        detail = entry.fallback_detail.splitlines()[0] if entry.fallback_detail else ""
        return (
            f"model '{self.name}': the entry frame '{entry.name}' fell back to eager on its first "
            f"call ({entry.fallback_cause.value}: {entry.fallback_cause.describe()}: {detail}) and "
            "has no compiled variant to dispatch to, so no artifact can be built from this capture; "
            "this is refused whatever require_complete says (require_complete=False does not get "
            "past it). Causes of such a fallback: " + ALL_CAUSES_IN_WORDS + ". Make the entry's "
            "first example call compile (fix what made Dynamo give up), or capture a smaller entry "
            "frame. The capture ran the call once eagerly and traced it again, so the break is "
            "not set-up on a first call alone (transformers installs its output-capturing hooks "
            "so, under a lock)."
        )

    def incompleteness_message(self) -> Optional[str]:
        s = self.summary()
        if s.complete:
            return None
        problems = []
        if s.uncovered_frames:
            reasons = []
            for name in s.uncovered_frames:
                f = self._frames[name]
                if f.compile_error:
                    reasons.append(f"'{name}' (compile error suppressed: {f.compile_error.splitlines()[0]})")
                elif f.calls == 0:
                    reasons.append(f"'{name}' (never called by the example calls)")
                else:
                    reasons.append(f"'{name}' (no captured variant)")
            problems.append("uncovered frames: " + ", ".join(reasons))
        if s.truncated:
            names = [f.name for f in self._frames.values() if f.truncated]
            problems.append(
                f"truncated: frames {names} hit recompile_limit={self.recompile_limit}, so later "
                "calls were not captured"
            )
        return (
            f"capture of model '{self.name}' is incomplete: " + "; ".join(problems) +
            ". Add example calls that cover them or raise recompile_limit, or pass "
            "require_complete=False to save it anyway."
        )

    def _script_context(self) -> ScriptContext:
        return ScriptContext(
            model=self.model,
            frames=list(self._frames.values()),
            globals_sites={
                f.name: self._globals_sites(f) for f in self._frames.values() if f.function is not None
            },
        )

    def _contents(
        self,
        eager_programs: Dict[str, str],
        python_programs: Optional[Dict[str, str]] = None,
        python_environment: Optional[Tuple[str, List[Tuple[str, str]]]] = None,
        code_by_value: Optional[Dict[str, List["python_program.CodeByValue"]]] = None,
    ) -> "ArtifactContents":
        from .artifact import ArtifactContents  # noqa: PLC0415 - the protos load only when needed

        return ArtifactContents(
            name=self.name,
            device=self.device,
            recompile_limit=self.recompile_limit,
            frames=list(self._frames.values()),
            summary=self.summary(),
            eager_programs=eager_programs,
            captured_calls=list(self._entry_calls),
            python_programs=python_programs or {},
            python_environment=python_environment,
            code_by_value=code_by_value or {},
        )

    def frames_text(self) -> str:
        from .artifact import frames_text  # noqa: PLC0415

        return frames_text(self._contents({}))

    def save(self, directory: Union[str, "os.PathLike[str]"], require_complete: bool = True) -> str:
        """Writes the artifact into `directory` (atomically) and returns its path."""
        from .artifact import write_artifact  # noqa: PLC0415

        message = self.variantless_entry_message()
        if message is not None:
            raise PrecompileError(message)
        if require_complete:
            message = self.incompleteness_message()
            if message is not None:
                raise PrecompileError(message)
        def first_three(lines: List[str]) -> str:
            return "; ".join(lines[:3]) + (f"; and {len(lines) - 3} more" if len(lines) > 3 else "")

        gaps = self.batch_gaps()
        if gaps:
            shown = first_three(gaps)
            warnings.warn(
                f"precompile capture: model '{self.name}': no variant serves the shapes of these example "
                f"calls at another batch (1, or one more than the call's): {shown}. Add example calls "
                "of those batches if clients send them (a batch of 1 needs one of its own: Dynamo's "
                "dynamic sizes start at 2)", RuntimeWarning, stacklevel=2)
        stepped = self.size_steps()
        if stepped:
            shown = first_three(stepped)
            warnings.warn(
                f"precompile capture: model '{self.name}': dynamic sizes the variants serve only in steps "
                f"or runs, or not below some size, or not above one (a shape guard of the model's code on "
                f"the size keeps a parity or a multiple of it, or a floor, as pooling does, or a ceiling, "
                f"as a size computed from it that the code took as 1 does): {shown}. Add example calls "
                "at the sizes clients send",
                RuntimeWarning, stacklevel=2)
        fixed = self.static_sizes()
        if fixed:
            warnings.warn(
                f"precompile capture: model '{self.name}': sizes the example calls varied are one fixed size "
                f"in every variant, so only the sizes the calls had are served: {'; '.join(fixed)}. Dynamo "
                "specialized them: the model's code used the size as a Python number (a loop's trip count, "
                "a shape it computed, a comparison); a size it keeps symbolic stays dynamic",
                RuntimeWarning, stacklevel=2)
        flagged = [f for f in self._frames.values() if f.eager_fallback]
        scripted = [f for f in flagged if f.eager_program != "python"]
        in_python = [f for f in flagged if f.eager_program == "python"]
        eager_dir = tempfile.mkdtemp(prefix="eager-", dir=self._workdir)
        try:
            paths = {f.name: os.path.join(eager_dir, f"{i}.pt") for i, f in enumerate(flagged)}
            context = self._script_context()
            build_eager_programs(context, scripted, paths)
            environment, code_by_value = (
                python_program.build_all(context, in_python, paths) if in_python else (None, {}))
            contents = self._contents(
                {f.name: paths[f.name] for f in scripted},
                {f.name: paths[f.name] for f in in_python},
                environment,
                code_by_value,
            )
            return write_artifact(contents, os.fspath(directory))
        finally:
            shutil.rmtree(eager_dir, ignore_errors=True)

    def close(self) -> None:
        """Deletes the compiled packages kept for save() (also done at exit)."""
        self._cleanup()


# The documented entry point, `Capture` itself, so that its signature and
# its defaults are written once.
capture = Capture
