"""Compiling one call of a frame into a variant, as Dynamo's backend would.

The frame's code is exported with strict torch.export (dimensions that
changed since earlier calls dynamic: Dynamo's automatic dynamic; a
structure's dimensions that the example calls always showed related are
declared so, see _related_dims), its guards
are read off the exported program, the user's decline hook sees it, and
AOTInductor compiles it into a package. A failure comes back in one of the
two ways Dynamo tells failures apart: Fallback (Dynamo gives up on the frame,
with the cause) or CompileError (an error Dynamo does not fall back on).
What a call needs and what a failure means for the frame is the recorder's
business (capture.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import logging
import os
import re
import time
import warnings
from typing import Any, Callable, ContextManager, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import torch
import torch._dynamo.exc as dynamo_exc
from torch.export import Dim as ExportDim

from .called_operators import package_operators
from .errors import PrecompileError
from .frames import Frame, Variant
from .guards import GuardExtractionError, GuardSet, NotPlainSymbol, extract_guards, output_specs
from .outputs import exported_leaf_kinds
from .summary import FallbackCause

# What the command line prints as it goes (cli.py); silent for a library's caller.
_progress = logging.getLogger("precompile_capture.progress")

_DETAIL_LINES = 6
_DETAIL_CHARS = 1500


# Threads are the serving machine's, not this one's: without dynamic_threads
# Inductor writes `#pragma omp parallel num_threads(N)`, N the capture
# machine's cores, into every parallel kernel, which oversubscribes a server
# given fewer cores (the gallery's BERT ran 1.6x slower on one core) and
# leaves a larger one's idle. With it each kernel takes the OpenMP threads of
# the thread that runs it, which the server sets (--torch_threads).
AOTI_CONFIGS = {"cpp.dynamic_threads": True}

# Inductor checks each vector ISA the CPU reports (AVX-512's bf16 and VNNI,
# AMX) by compiling a probe and loading it in a new Python that first imports
# torch: about 1.5 s a probe, six on a machine with AVX-512, some 10 s of
# every process that captures. The probes link nothing of torch: each is
# loaded without it first, and with it only where that fails, so the answer
# is the one Inductor's own check gives.
_ISA_PROBE_LOAD = """
from ctypes import cdll
try:
    cdll.LoadLibrary("__lib_path__")
except OSError:
    import torch
    cdll.LoadLibrary("__lib_path__")
"""


def _load_isa_probes_without_torch() -> None:
    from torch._inductor import cpu_vec_isa

    loader = getattr(cpu_vec_isa.VecISA, "_avx_py_load", None)
    if isinstance(loader, str) and "__lib_path__" in loader:
        cpu_vec_isa.VecISA._avx_py_load = _ISA_PROBE_LOAD


class Fallback(Exception):
    """Dynamo gives up on the frame for `cause`."""

    def __init__(self, cause: FallbackCause, detail: str, error: Optional[BaseException] = None) -> None:
        super().__init__(detail)
        self.cause = cause
        self.detail = detail
        self.error_type = (
            f"{type(error).__module__}.{type(error).__qualname__}" if error is not None else ""
        )


class CompileError(Exception):
    """Exporting or compiling failed for a reason Dynamo does not fall back on."""

    def __init__(self, stage: str, error: BaseException) -> None:
        super().__init__(f"{stage} failed: {type(error).__name__}: {compile_error_detail(str(error))}")
        self.stage = stage
        self.error = error


def compile_error_detail(text: str) -> str:
    """What to show of an error: its first lines; for a C++ compile error
    (Inductor's CppCompileError: a title, the compiler's command line, then
    its output), the title and the compiler's first errors, which the
    command line of several thousand characters would otherwise push out."""
    title, command, output = text.partition("\nOutput:")
    errors = [line.strip() for line in output.splitlines() if "error:" in line]
    if not command or not errors:
        return first_lines(text, 4)
    return first_lines("\n".join([title.strip().splitlines()[0], *errors[:3]]), 4)


def graph_break_detail(text: str) -> str:
    """What to show of a graph break: Dynamo's first lines, the first (which
    every short form of the message keeps) ending with where in the user's
    code the break is: the innermost frame of Dynamo's "from user code"
    trace (file name, line, function, code), which would otherwise be cut
    off with the rest."""
    detail = first_lines(text)
    frames = re.findall(r'File "([^"]+)", line (\d+), in (\S+)\n[ \t]*([^\n]*)',
                        text.partition("\nfrom user code:\n")[2])
    if not frames:
        return detail
    path, line, function, code = frames[-1]
    first, newline, rest = detail.partition("\n")
    # The file's name alone: the detail is saved in the artifact, which must
    # not depend on where the capture ran.
    return (f"{first} (at {os.path.basename(path)}:{line} in {function}: {code.strip()})"
            f"{_config_copy_hint(frames)}{newline}{rest}")


def _config_copy_hint(frames: List[Tuple[str, str, str, str]]) -> str:
    """What to change when the break is transformers copying a model's
    config: an encoder-decoder with a flat config (T5, BART, Whisper...)
    called without a cache builds one at every call from a deep copy of
    the config, which Dynamo does not trace."""
    if not any(os.path.basename(path) == "configuration_utils.py" and function == "get_text_config"
               for path, _, function, _ in frames):
        return ""
    return ("; transformers builds the cache from a copy of the config when a call passes none: "
            "pass the cache to start from, as model.generate() does "
            "(past_key_values=EncoderDecoderCache(DynamicCache(), DynamicCache())), "
            "or use_cache=False, and the frame compiles")


def first_lines(text: str, n: int = _DETAIL_LINES) -> str:
    lines = [line.rstrip() for line in text.strip().splitlines() if line.strip()]
    out = "\n".join(lines[:n])
    return out[:_DETAIL_CHARS]


_USER_CODE_LINE = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')


def with_user_site(detail: str, error: BaseException) -> str:
    """`detail` with its first line naming the line of the model's code
    where Dynamo gave up: the innermost of the user code that Dynamo's
    message lists, which the first lines (all a refusal quotes) leave out."""
    text = str(error)
    start = text.find("from user code:")
    sites = _USER_CODE_LINE.findall(text[start:]) if start >= 0 else []
    if not sites:
        return detail
    path, line, function = sites[-1]
    path = path.split("site-packages/")[-1]
    first, newline, rest = detail.partition("\n")
    return f"{first} [at {path}:{line}, in {function}]{newline}{rest}"


def _cause_chain(error: BaseException) -> Iterator[BaseException]:
    seen = set()
    e: Optional[BaseException] = error
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield e
        e = e.__cause__ or e.__context__


class _ExportWrapper(torch.nn.Module):
    """The module torch.export traces for a frame: its code, called from the
    frame's inputs in order (so that the exported program's user inputs are
    exactly those inputs, keywords, **kwargs entries and the leaves of
    structures included)."""

    def __init__(self, frame: Frame) -> None:
        super().__init__()
        self.frame_module = frame.module
        self._function = frame.function
        self._frame = frame

    def forward(self, *inputs: Any) -> Any:
        args, kwargs = self._frame.call_arguments(list(inputs))
        if self.frame_module is not None:
            return self.frame_module.forward(*args, **kwargs)
        return self._function(*args, **kwargs)


Dims = Dict[int, List[int]]
# (input, dimension) -> (the group's first member, its size minus the
# first's, the smallest size of the first).
Relations = Dict[Tuple[int, int], Tuple[Tuple[int, int], int, int]]


def _related_dims(frame: Frame, dynamic: Dims) -> Relations:
    """Dynamic dimensions of a structure's leaves (a cache's lengths) and of
    other inputs whose sizes differed by the same constant in every call a
    variant was compiled from (an attention mask one longer than the cache).

    torch.export relates two sizes only where the program checks them; a
    cache's layers and the mask that goes with them are related only by how
    they were made, and compiled code given unrelated ones reads past its
    buffers. What the example calls showed becomes the guard instead."""
    history = frame.compiled_shapes
    dims = [(i, d) for i, ds in sorted(dynamic.items()) for d in ds]

    def sizes(dim: Tuple[int, int]) -> List[Optional[int]]:
        i, d = dim
        return [shapes[i][d] if shapes[i] is not None and len(shapes[i]) > d else None for shapes in history]

    def difference(a: Tuple[int, int], b: Tuple[int, int]) -> Optional[int]:
        pairs = [(x, y) for x, y in zip(sizes(a), sizes(b)) if x is not None and y is not None]
        gaps = {x - y for x, y in pairs}
        return gaps.pop() if len(pairs) >= 2 and len(gaps) == 1 else None

    relations: Relations = {}
    for a in dims:
        if a in relations or not frame.params[a[0]].tree:
            continue
        group = [b for b in dims if b not in relations and (b == a or difference(b, a) is not None)]
        if len(group) < 2:
            continue
        current = {b: sizes(b)[-1] for b in group}
        first = min(group, key=lambda b: current[b])
        for b in group:
            # Any length from 1: a cache after a one-token prompt.
            relations[b] = (first, current[b] - current[first], 1)
    return relations


def _is_skip_frame_call(error: BaseException) -> bool:
    gb_type = getattr(error, "gb_type", "") or ""
    return "skip_frame()" in gb_type


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Keeps torch's own prints (graphs of failed traces) off the user's stdout."""
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer), warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", FutureWarning)
        yield


def _merged_symbols(guards: GuardSet, relations: Relations) -> Relations:
    """Relations for the dimensions of each guard symbol that stands for
    several of the exported program's symbols (extract_guards relates them),
    unless they are declared related already. Their range stays the one the
    guards give (export's 0/1 specialization included)."""
    ranges = {s.symbol: s for s in guards.symbols}
    members: Dict[int, List[Tuple[Tuple[int, int], int]]] = {}
    for g in guards.args:
        if g.tensor is None:
            continue
        for d, dim in enumerate(g.tensor.dims):
            if dim.symbol is not None and "=" in ranges[dim.symbol].name:
                members.setdefault(dim.symbol, []).append(((g.parameter, d), dim.offset))
    merged: Relations = {}
    for symbol, group in members.items():
        if all(dim in relations for dim, _ in group):
            continue
        first, base = min(group, key=lambda m: m[1])
        for dim, offset in group:
            merged[dim] = (first, offset - base, ranges[symbol].min + base)
    return merged


def limit_of(limits: Mapping[Optional[int], int], dim: int) -> Optional[int]:
    """The largest size `limits` (--max-size, per dimension, None for every
    one) allow in dimension `dim`: its own limit, else every dimension's."""
    return limits.get(dim, limits.get(None))


def limited_sizes(guards: GuardSet, frame: Frame, values: Sequence[Any], captured_from: str) -> GuardSet:
    """`guards` with each dimension that `frame.size_limits` bounds at most
    its limit: the symbol it is bound to gets the limit as its largest
    value, so that the server refuses a larger call before compiled code
    runs at any size a client sends. A call that passes a limit itself
    cannot be captured."""
    largest: Dict[int, int] = {}
    for g in guards.args:
        name = frame.params[g.parameter].name
        limits = frame.size_limits.get(name)
        if limits is None or g.tensor is None:
            continue
        rank = len(g.tensor.dims)
        beyond = sorted(d for d in limits if d is not None and d >= rank)
        if beyond:
            raise PrecompileError(
                f"{captured_from}: --max-size {name}.{beyond[0]}={limits[beyond[0]]} names dimension "
                f"{beyond[0]} of '{name}', which has {rank}")
        for d, dim in enumerate(g.tensor.dims):
            limit = limit_of(limits, d)
            if limit is None:
                continue
            size = int(values[g.parameter].shape[d])
            if size > limit:
                raise PrecompileError(
                    f"{captured_from}: '{name}' has {size} in dimension {d}, more than the {limit} "
                    f"that --max-size {name}{'' if d not in limits else f'.{d}'}={limit} allows")
            if dim.symbol is not None:
                largest[dim.symbol] = min(largest.get(dim.symbol, limit - dim.offset), limit - dim.offset)
    symbols = tuple(
        dataclasses.replace(s, max=largest[s.symbol] if s.max is None else min(s.max, largest[s.symbol]))
        if s.symbol in largest else s
        for s in guards.symbols)
    return dataclasses.replace(guards, symbols=symbols)


class VariantCompiler:
    """Compiles variants into packages under `workdir`. `decline` is the
    capture's decline hook (or None); `outside_capture` makes a context in
    which the frames' code runs as the user wrote it (the capture's
    interception off) while it is traced, declined or compiled. `static`:
    never a dynamic dimension (torch.compile's dynamic=False)."""

    def __init__(
        self,
        workdir: str,
        decline: Optional[Callable[[torch.export.ExportedProgram], Any]],
        outside_capture: Callable[[], ContextManager[None]],
        static: bool = False,
    ) -> None:
        self._workdir = workdir
        self._static = static
        self.decline = decline
        self._outside_capture = outside_capture
        # (frame, variant id, seconds) of every compile.
        self.compile_log: List[Tuple[str, str, float]] = []
        self.export_count = 0

    def _dynamic_dims(self, frame: Frame, values: List[Any]) -> Dims:
        """Dynamo's automatic dynamic: dimensions that changed since earlier captures."""
        frame.compiled_shapes.append(
            [tuple(int(s) for s in v.shape) if isinstance(v, torch.Tensor) else None for v in values]
        )
        dynamic: Dims = {}
        if self._static:
            return dynamic
        for i, v in enumerate(values):
            if not isinstance(v, torch.Tensor):
                continue
            seen = frame.seen_sizes.get(i)
            if seen is None or len(seen) != v.dim():
                frame.seen_sizes[i] = [int(s) for s in v.shape]
                continue
            for d, size in enumerate(v.shape):
                if seen[d] is not None and seen[d] != size:
                    seen[d] = None
            dims = [d for d, s in enumerate(seen) if s is None]
            if dims:
                dynamic[i] = dims
        return dynamic

    def _export(
        self, frame: Frame, values: List[Any], dynamic: Dims, relations: Relations
    ) -> torch.export.ExportedProgram:
        # The guards cannot say that two arguments are one tensor: export copies.
        seen_ids: set = set()
        export_values = []
        for v in values:
            if isinstance(v, torch.Tensor):
                if id(v) in seen_ids:
                    v = v.clone()
                seen_ids.add(id(v))
            export_values.append(v)
        dynamic_shapes = None
        if dynamic:
            named = {
                first: ExportDim(f"{frame.params[first[0]].name.replace('.', '_')}_{first[1]}", min=smallest)
                for first, _, smallest in relations.values()
            }

            def dim(i: int, d: int) -> Any:
                if (i, d) not in relations:
                    return ExportDim.AUTO
                first, offset, _ = relations[(i, d)]
                return named[first] + offset if offset else named[first]

            # Keyed by the wrapper's one parameter, *inputs.
            dynamic_shapes = {
                "inputs": tuple(
                    {d: dim(i, d) for d in dynamic[i]} if dynamic.get(i) else None
                    for i in range(len(export_values))
                )
            }
        wrapper = _ExportWrapper(frame)
        self.export_count += 1
        with self._outside_capture(), quiet():
            return torch.export.export(wrapper, tuple(export_values), dynamic_shapes=dynamic_shapes, strict=True)

    def _trace(self, frame: Frame, values: List[Any]) -> Tuple[torch.export.ExportedProgram, Any, List[int]]:
        if frame.is_generator:
            raise Fallback(
                FallbackCause.GENERATOR,
                f"'{frame.name}' is a generator function: Dynamo does not trace generator frames",
            )
        dynamic = self._dynamic_dims(frame, values)
        relations = _related_dims(frame, dynamic)
        # Whether the export being tried makes sizes one that the guards
        # required equal, and whether the program refused that once.
        merging = merge_refused = False
        for _ in range(6):
            try:
                ep = self._export(frame, values, dynamic, relations)
            except dynamo_exc.UserError as e:
                if relations and e.error_type in (
                    dynamo_exc.UserErrorType.CONSTRAINT_VIOLATION, dynamo_exc.UserErrorType.INVALID_INPUT
                ):
                    # The program does not allow the relations the calls
                    # showed, or those the guards asked for: a size made one
                    # gets guards the solver cannot prove over its whole range
                    # (on CUDA, scaled_dot_product_attention's padding of a
                    # mask to a multiple of 8). The sizes stay apart.
                    relations = {}
                    merge_refused = merge_refused or merging
                    merging = False
                    continue
                if e.error_type is dynamo_exc.UserErrorType.INVALID_INPUT:
                    # The inputs or dynamic shapes the capture passed: not the program's doing.
                    raise CompileError("torch.export", e) from e
                raise Fallback(FallbackCause.USER_ERROR, with_user_site(first_lines(str(e)), e), e) from e
            except dynamo_exc.Unsupported as e:
                cause = FallbackCause.SKIP_FRAME if _is_skip_frame_call(e) else FallbackCause.GRAPH_BREAK
                raise Fallback(cause, graph_break_detail(str(e)), e) from e
            except dynamo_exc.SkipFrame as e:
                raise Fallback(FallbackCause.BACKEND_SKIP, first_lines(f"Dynamo skipped the frame: {e}"), e) from e
            except PrecompileError:
                raise
            except Exception as e:  # noqa: BLE001 - every other failure is a compile error
                raise CompileError("torch.export", e) from e
            try:
                guards, tensor_inputs = extract_guards(ep, values, [p.name for p in frame.params])
            except NotPlainSymbol as e:
                # A size that is an expression of symbols: capture those dims static.
                relations = {}
                for i, d in e.dims:
                    dims = [x for x in dynamic.get(i, []) if x != d]
                    if dims:
                        dynamic[i] = dims
                    else:
                        dynamic.pop(i, None)
                continue
            except GuardExtractionError as e:
                raise CompileError("reading the guards", e) from e
            merged = _merged_symbols(guards, relations)
            if merged and not merge_refused:
                # The guards require sizes equal that the program keeps apart:
                # export again with them one size, so that the compiled code
                # assumes what the guards check (and needs no bounds check
                # between them). Where the program refuses that, the guards
                # still check them equal and the compiled code checks bounds.
                relations.update(merged)
                merging = True
                continue
            return ep, guards, tensor_inputs
        raise CompileError("reading the guards", RuntimeError("sizes stayed symbolic expressions after re-exporting static"))

    def compile(self, frame: Frame, values: List[Any], captured_from: str) -> Variant:
        """A new variant of `frame` for the call whose inputs are `values`
        (in the frame's order), `captured_from` naming that call; Fallback
        or CompileError where there is none."""
        # Exports and compiles can take minutes (Inductor's index
        # simplification of a large dynamic graph more): say which call.
        _progress.info("frame '%s': exporting and compiling a variant for %s", frame.name, captured_from)
        ep, guards, tensor_inputs = self._trace(frame, values)
        if frame.size_limits:
            guards = limited_sizes(guards, frame, values, captured_from)
        if self.decline is not None:
            try:
                with self._outside_capture():
                    self.decline(ep)
            except dynamo_exc.SkipFrame as e:
                raise Fallback(FallbackCause.BACKEND_SKIP, first_lines(f"the backend declined the graph: {e}"), e) from e
            except Exception as e:  # noqa: BLE001
                raise CompileError("the backend's decline hook", e) from e
        index = len(frame.variants)
        variant_id = f"{frame.name}#{index}"
        package = os.path.join(self._workdir, f"{len(self.compile_log)}-{index}.pt2")
        start = time.monotonic()
        _load_isa_probes_without_torch()
        try:
            with self._outside_capture(), quiet():
                torch._inductor.aoti_compile_and_package(
                    ep, package_path=package, inductor_configs=AOTI_CONFIGS)
        except Exception as e:  # noqa: BLE001
            for inner in _cause_chain(e):
                if isinstance(inner, dynamo_exc.SkipFrame):
                    raise Fallback(
                        FallbackCause.BACKEND_SKIP, first_lines(f"the backend declined the graph: {inner}"), inner
                    ) from e
                if isinstance(inner, dynamo_exc.exceptions_allowed_to_be_fallback):
                    raise Fallback(
                        FallbackCause.GRAPH_BREAK,
                        first_lines(
                            f"the backend failed with {type(inner).__name__}, an error Dynamo "
                            f"falls back on: {inner}"
                        ),
                        inner,
                    ) from e
            raise CompileError("AOTInductor compile", e) from e
        seconds = time.monotonic() - start
        variant = Variant(
            index=index,
            id=variant_id,
            package=package,
            guards=guards,
            tensor_inputs=tensor_inputs,
            leaf_kinds=exported_leaf_kinds(ep),
            outputs=output_specs(ep, guards),
            captured_from=captured_from,
            compile_seconds=seconds,
            operators=package_operators(package),
        )
        self.compile_log.append((frame.name, variant_id, seconds))
        _progress.info("frame '%s': %s compiled in %.1f s", frame.name, variant_id, seconds)
        return variant
