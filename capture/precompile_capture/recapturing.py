"""Recapture: the next version of a model, covering the calls its server missed.

The server records, per frame, the distinct signatures of the calls no variant
matched (admin.proto's MissesResponse; its JSON form is the misses file). A
recapture reads the newest version N of REPOSITORY/MODEL and captures the model
afresh on, in order:

1. the entry calls version N was captured from (its manifest's
   captured_calls) that a variant of version N covers, so that version N+1
   keeps what version N covered;
2. any extra example calls given;
3. every distinct signature of the entry frame in the misses file, the most
   frequent first;
4. the rest of version N's captured calls: those it served eagerly.

The order matters because a call that makes Dynamo give up on a frame (a
graph break it cannot resume from) ends the frame's compiles, as Dynamo skips
the frame from then on: calls known to compile go before calls that may flag.

Each call is synthesized from its signature (tensors of the recorded dtype,
device and shape with made-up values; scalars their value) and bound as the
entry's signature takes it (Parameter.binding). Version N+1 is written into a
directory of MODEL whose name is not a number (the server's repository scan
ignores it) and renamed to N+1 in one step, so the server never sees a partial
version; a rescan then picks it up.

Only the entry frame's misses are replayed: a sub-frame is called by its
caller's code, with arguments the capture cannot make up from the sub-frame's
signature alone, so its misses are covered only when a replayed entry call
runs its caller eagerly and makes such a call. Whether version N+1 covers
each recorded miss is judged by version N+1's saved guards (rebuilt as
GuardSets from the manifest, the inverse of artifact.guards_proto, so exactly
the semantics of the capture's own dispatch that the differential tests
compare with the runtime).

Bad input is refused before anything is written, and a failure after the
capture leaves nothing behind: version N and the rest of the repository stay
as they were.
"""

from __future__ import annotations

import ctypes
import dataclasses
import errno
import functools
import os
import re
import shutil
import sys
import tempfile
import types
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import torch
import torch.utils._pytree as pytree
from google.protobuf import json_format
from torch._subclasses.fake_tensor import FakeTensorMode

from proto import admin_pb2
from proto import artifact_pb2 as pb

import precompile_eager

from .artifact import MANIFEST, dtype_from_proto, guards_from_proto, outputs_from_proto, scalar_value
from .capture import capture
from .compiling import first_lines, limit_of
from .errors import PrecompileError
from .outputs import output_schema
from .guards import DTYPE_NAMES
from .names import resolve_frames
from .summary import FallbackCause

# What a miss's result says of it.
COVERED = "covered"
EAGER = "stays eager"
NOT_COVERED = "not covered"

# Integer tensors made up from a signature hold values in [0, 2) unless the
# caller gives a range for the parameter: small enough to index any table.
DEFAULT_INT_RANGE = (0, 2)

_VERSION = re.compile(r"[0-9]+")
_Binding = pb.Parameter.Binding


@dataclasses.dataclass(frozen=True)
class MissResult:
    """What version N+1 does with one signature the server recorded."""

    frame: str
    signature: str  # In words: "forward(x: float32[3, 4], k: 0)".
    count: int
    outcome: str  # How the old version served it: "REFUSED" or "EAGER_FALLBACK".
    status: str  # COVERED, EAGER or NOT_COVERED.
    variant: str = ""  # The variant that covers it, when COVERED.
    detail: str = ""  # Why it stays eager or is not covered.

    def describe(self) -> str:
        calls = f"{self.count} call{'' if self.count == 1 else 's'}"
        if self.status == COVERED:
            verdict = f"covered by variant {self.variant}"
        else:
            verdict = f"{self.status}: {self.detail}"
        return f"{self.signature}: {calls}, {self.outcome}; {verdict}"


@dataclasses.dataclass(frozen=True)
class RecaptureReport:
    """What a recapture wrote and what it does with the recorded misses."""

    model_name: str
    directory: str  # The new version's directory, REPOSITORY/MODEL/<version>.
    version: int
    previous_version: int
    misses_version: int  # The version whose server recorded the misses (0: not said).
    # Entry calls replayed: from the previous version's captured_calls, from
    # the extra calls, and distinct missed signatures of the entry.
    replayed_captured: int
    replayed_extra: int
    replayed_misses: int
    variants_per_frame: Dict[str, int]
    eager_fallbacks: Tuple[str, ...]
    complete: bool
    results: Tuple[MissResult, ...]
    # Per frame: missed calls whose signatures the server did not keep.
    other_calls: Dict[str, int]

    def format(self) -> str:
        """The report the command line prints."""
        lines = [
            f"precompile_capture: recaptured model '{self.model_name}' as version {self.version}: {self.directory}",
            f"  replayed {self.replayed_captured} call(s) version {self.previous_version} was captured from, "
            f"{self.replayed_extra} extra call(s), {self.replayed_misses} missed signature(s) of the entry frame",
            f"  variants: {self.variants_per_frame}; eager fallbacks: {list(self.eager_fallbacks)}; "
            f"complete: {self.complete}",
        ]
        source = f"version {self.misses_version}" if self.misses_version else "the server"
        lines.append(f"  misses recorded by {source}, as version {self.version} serves them:")
        for r in self.results:
            lines.append(f"    {r.describe()}")
        for frame, n in self.other_calls.items():
            lines.append(
                f"    {frame}: {n} more missed call(s) whose signatures the server did not keep "
                "(its --miss_signatures_per_frame bound); not replayed"
            )
        lines.append(f"  rescan the repository (admin Rescan) to serve version {self.version}")
        return "\n".join(lines)


# -- reading the repository and the misses file ------------------------------------------


def newest_version(model_dir: str) -> Tuple[int, str]:
    """The newest version of a model directory, as the server's scan sees it:
    the largest positive number naming a subdirectory."""
    if not os.path.isdir(model_dir):
        raise PrecompileError(f"{model_dir} is not a directory (expected REPOSITORY/MODEL)")
    versions = []
    for name in os.listdir(model_dir):
        path = os.path.join(model_dir, name)
        if _VERSION.fullmatch(name) and int(name) > 0 and os.path.isdir(path):
            versions.append((int(name), path))
    if not versions:
        raise PrecompileError(
            f"{model_dir} has no version directory (a positive number holding an artifact) to recapture"
        )
    return max(versions)


def read_manifest(directory: str) -> pb.Manifest:
    path = os.path.join(directory, MANIFEST)
    m = pb.Manifest()
    try:
        with open(path, "rb") as f:
            m.ParseFromString(f.read())
    except OSError as e:
        raise PrecompileError(f"cannot read {path}: {e}") from e
    except Exception as e:  # noqa: BLE001 - protobuf's DecodeError and friends
        raise PrecompileError(f"{path} is not a precompile manifest: {e}") from e
    if not m.entry_frame or not any(f.name == m.entry_frame for f in m.frames):
        raise PrecompileError(f"{path} names no entry frame among its frames: not a precompile manifest")
    return m


def load_misses(misses: Union[str, "os.PathLike[str]", admin_pb2.MissesResponse]) -> Tuple[admin_pb2.MissesResponse, str]:
    """The misses and how to name where they came from in errors."""
    if isinstance(misses, admin_pb2.MissesResponse):
        return misses, "the misses"
    path = os.fspath(misses)
    try:
        with open(path) as f:
            text = f.read()
    except OSError as e:
        raise PrecompileError(f"cannot read the misses file {path}: {e}") from e
    proto = admin_pb2.MissesResponse()
    try:
        json_format.Parse(text, proto)
    except json_format.ParseError as e:
        raise PrecompileError(
            f"the misses file {path} is not the JSON of a precompile.v1.MissesResponse (what the "
            f"server's admin Misses call returns): {e}"
        ) from e
    return proto, f"the misses file {path}"


def frame_of(manifest: pb.Manifest, name: str) -> Optional[pb.Frame]:
    for f in manifest.frames:
        if f.name == name:
            return f
    return None


# -- signatures -------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _TensorSig:
    dtype: torch.dtype
    device: str
    shape: Tuple[int, ...]


def _check_signature(sig: pb.CallSignature, frame: pb.Frame, where: str) -> None:
    """Refuses a signature that does not fit the frame's parameters."""
    names = [p.name for p in frame.parameters]
    seen = set()
    for a in sig.arguments:
        if a.name not in names:
            raise PrecompileError(
                f"{where}: names parameter '{a.name}', which frame '{frame.name}' does not have "
                f"(its parameters: {', '.join(names) or 'none'})"
            )
        if a.name in seen:
            raise PrecompileError(f"{where}: names parameter '{a.name}' twice")
        seen.add(a.name)
        which = a.WhichOneof("value")
        if which == "tensor":
            dtype_from_proto(a.tensor.dtype, f"{where}, parameter '{a.name}'")
            if a.tensor.device not in ("cpu", "cuda"):
                raise PrecompileError(
                    f"{where}, parameter '{a.name}': device {a.tensor.device!r} is not cpu or cuda"
                )
            if any(s < 0 for s in a.tensor.shape):
                raise PrecompileError(f"{where}, parameter '{a.name}': shape {list(a.tensor.shape)} has a negative size")
        elif which == "scalar":
            scalar_value(a.scalar, f"{where}, parameter '{a.name}'")
        else:
            raise PrecompileError(f"{where}, parameter '{a.name}': neither a tensor nor a scalar")
    for p in frame.parameters:
        if p.name not in seen and not p.HasField("default_value"):
            raise PrecompileError(
                f"{where}: lacks parameter '{p.name}' of frame '{frame.name}', which has no default"
            )


def _signature_values(sig: pb.CallSignature, frame: pb.Frame) -> List[Any]:
    """Per parameter of `frame`, in order: a _TensorSig or the scalar value
    (a parameter the signature leaves out has its default). Raises
    PrecompileError (without a location) when the signature does not fit."""
    given: Dict[str, Any] = {}
    for a in sig.arguments:
        if a.WhichOneof("value") == "tensor":
            given[a.name] = _TensorSig(
                dtype_from_proto(a.tensor.dtype, f"parameter '{a.name}'"), a.tensor.device, tuple(a.tensor.shape)
            )
        else:
            given[a.name] = scalar_value(a.scalar, f"parameter '{a.name}'")
    names = {p.name for p in frame.parameters}
    unknown = [n for n in given if n not in names]
    if unknown:
        raise PrecompileError(f"frame '{frame.name}' has no parameter '{unknown[0]}'")
    values: List[Any] = []
    for p in frame.parameters:
        if p.name in given:
            v = given[p.name]
        elif p.HasField("default_value"):
            v = scalar_value(p.default_value, f"the default of parameter '{p.name}'")
        else:
            raise PrecompileError(f"no value for parameter '{p.name}' of frame '{frame.name}', which has no default")
        # The runtime's guards see a FLOAT parameter's int as a float.
        if p.kind == pb.Parameter.FLOAT and type(v) is int:
            v = float(v)
        values.append(v)
    return values


def signature_words(frame: str, sig: pb.CallSignature, device: str) -> str:
    """A signature as people read it: `forward(x: float32[3, 4], k: 0)`."""
    parts = []
    for a in sig.arguments:
        if a.WhichOneof("value") == "tensor":
            try:
                dtype = DTYPE_NAMES[dtype_from_proto(a.tensor.dtype, a.name)]
            except PrecompileError:
                dtype = pb.DType.Name(a.tensor.dtype) if a.tensor.dtype in pb.DType.values() else str(a.tensor.dtype)
            where = "" if a.tensor.device == device else f" on {a.tensor.device}"
            parts.append(f"{a.name}: {dtype}[{', '.join(str(s) for s in a.tensor.shape)}]{where}")
        else:
            try:
                parts.append(f"{a.name}: {scalar_value(a.scalar, a.name)!r}")
            except PrecompileError:
                parts.append(f"{a.name}: (no value)")
    return f"{frame}({', '.join(parts)})"


class _Judge:
    """Says which variant of a manifest frame a signature's call matches, by
    the frame's saved guards evaluated as the capture evaluates them
    (GuardSet.holds) on fake tensors of the signature's dtype, device and
    shape, with gradients off as the server runs (InferenceMode)."""

    def __init__(self) -> None:
        self._mode = FakeTensorMode()
        # id(frame) -> (frame, its variants' guards). The frame is kept so
        # that its id is not reused: a manifest hands out a new wrapper for
        # a frame whenever the last one is gone, at whatever address is free,
        # which may be where another frame's wrapper was.
        self._guards: Dict[int, Tuple[pb.Frame, List[Tuple[str, Any]]]] = {}

    def covering_variant(self, frame: pb.Frame, sig: pb.CallSignature) -> Optional[str]:
        """The id of the first variant whose guards hold; PrecompileError when
        the signature does not fit the frame's parameters."""
        values = _signature_values(sig, frame)
        with self._mode:
            call = [
                torch.empty(v.shape, dtype=v.dtype, device=v.device) if isinstance(v, _TensorSig) else v
                for v in values
            ]
        cached = self._guards.get(id(frame))
        if cached is None:
            cached = (frame, [(v.id, guards_from_proto(v)) for v in frame.variants])
            self._guards[id(frame)] = cached
        _, guards = cached
        with torch.no_grad():
            for variant_id, g in guards:
                if g.holds(call):
                    return variant_id
        return None


# -- making calls from signatures ---------------------------------------------------------


def _make_value(v: Any, name: str, generator: torch.Generator, int_ranges: Mapping[str, Tuple[int, int]]) -> Any:
    if not isinstance(v, _TensorSig):
        return v
    if v.dtype.is_floating_point:
        t = torch.randn(v.shape, generator=generator, dtype=torch.float32).to(v.dtype)
    elif v.dtype is torch.bool:
        t = torch.zeros(v.shape, dtype=torch.bool)
    else:
        lo, hi = int_ranges.get(name, DEFAULT_INT_RANGE)
        t = torch.randint(lo, hi, v.shape, generator=generator).to(v.dtype)
    return t.to(v.device)


def call_from_signature(
    sig: pb.CallSignature,
    frame: pb.Frame,
    seed: int,
    int_ranges: Mapping[str, Tuple[int, int]],
) -> Tuple[List[Any], Dict[str, Any]]:
    """A call of `frame` with `sig`'s signature, bound as the frame's Python
    signature takes each parameter: positional-only and *args entries by
    position, keyword-only and **kwargs entries by keyword (a **kwargs entry
    that is None left out: absent), the others by keyword unless *args
    entries follow them, which forces them to be positional."""
    values = _signature_values(sig, frame)
    generator = torch.Generator().manual_seed(seed)
    has_var_positional = any(p.binding == _Binding.VAR_POSITIONAL for p in frame.parameters)
    trees = {p.structure for p in frame.parameters if p.structure}
    specs = {s.parameter: _loaded_tree_spec(s.tree_spec, s.parameter, frame.name)
             for s in frame.structures if s.parameter in trees}
    empty = {s.parameter: _loaded_tree_spec(s.empty_tree_spec, s.parameter, frame.name)
             for s in frame.structures if s.empty_tree_spec}
    args: List[Any] = []
    kwargs: Dict[str, Any] = {}
    leaves: Dict[str, List[Any]] = {}
    for p, v in zip(frame.parameters, values):
        value = _make_value(v, p.name, generator, int_ranges)
        name = p.name
        if p.structure:
            # A structure's leaves: the structure once they are all made.
            gathered = leaves.setdefault(p.structure, [])
            gathered.append(value)
            if len(gathered) < specs[p.structure].num_leaves:
                continue
            name = p.structure
            value = precompile_eager.structure_from_leaves(specs[name], gathered)
        if value is None and name in empty:
            value = pytree.tree_unflatten([], empty[name])
        if p.binding in (_Binding.POSITIONAL_ONLY, _Binding.VAR_POSITIONAL) or (
            p.binding == _Binding.POSITIONAL_OR_KEYWORD and has_var_positional
        ):
            args.append(value)
        elif p.binding == _Binding.VAR_KEYWORD and value is None:
            continue
        else:
            kwargs[name] = value
    return args, kwargs


def _loaded_tree_spec(tree_spec: str, parameter: str, frame: str) -> pytree.TreeSpec:
    """The spec of a structure a frame takes (its library's node types
    registered first, as the capture registered them)."""
    if not tree_spec:
        raise PrecompileError(
            f"frame '{frame}': the structure of parameter '{parameter}' was not "
            "recorded (torch cannot serialize its type), so calls of it cannot be replayed"
        )
    if "transformers" in tree_spec:
        from transformers.cache_utils import DynamicCache, EncoderDecoderCache  # noqa: PLC0415

        precompile_eager.register_known_structures(DynamicCache)
        precompile_eager.register_known_structures(EncoderDecoderCache)
    try:
        return pytree.treespec_loads(tree_spec)
    except Exception as e:  # noqa: BLE001 - an unknown type, a format of another torch
        raise PrecompileError(
            f"frame '{frame}': cannot rebuild the structure of parameter '{parameter}': {e}"
        ) from e


def parse_int_range(text: str) -> Tuple[str, Tuple[int, int]]:
    """NAME=LO:HI (values in [LO, HI))."""
    m = re.fullmatch(r"\s*([^=\s]+)\s*=\s*(-?[0-9]+)\s*:\s*(-?[0-9]+)\s*", text)
    if m is None:
        raise PrecompileError(f"--int-range {text!r}: expected NAME=LO:HI, e.g. input_ids=0:1000")
    lo, hi = int(m.group(2)), int(m.group(3))
    if lo >= hi:
        raise PrecompileError(f"--int-range {text!r}: the range [{lo}, {hi}) is empty (LO must be below HI)")
    return m.group(1), (lo, hi)


# -- publishing -------------------------------------------------------------------------


def _rename_noreplace(src: str, dst: str) -> None:
    """Renames `src` to `dst` in one step, failing if `dst` exists (a plain
    rename would replace an empty directory). renameat2(RENAME_NOREPLACE)
    where the system has it; elsewhere a check just before the rename."""
    renameat2 = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None) if sys.platform.startswith("linux") else None
    if renameat2 is not None:
        renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
        at_fdcwd, rename_noreplace = -100, 1
        if renameat2(at_fdcwd, os.fsencode(src), at_fdcwd, os.fsencode(dst), rename_noreplace) == 0:
            return
        err = ctypes.get_errno()
        if err not in (errno.ENOSYS, errno.EINVAL):
            raise OSError(err, os.strerror(err), dst)
    if os.path.lexists(dst):
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), dst)
    os.rename(src, dst)


# -- recapture -------------------------------------------------------------------------


def _check_misses(misses: admin_pb2.MissesResponse, where: str, old: pb.Manifest, old_dir: str, old_version: int) -> None:
    if misses.model_name != old.model_name:
        raise PrecompileError(
            f"{where} is from model '{misses.model_name}' but {old_dir} holds model '{old.model_name}': "
            "give the misses the server recorded for this model"
        )
    if misses.torch_version != torch.__version__:
        raise PrecompileError(
            f"{where} was recorded by a server running torch {misses.torch_version or '(not said)'} but this "
            f"process runs torch {torch.__version__}: recapture with the torch the server runs (an artifact "
            "loads only into the torch that captured it)"
        )
    if misses.device != old.device:
        raise PrecompileError(
            f"{where} is from a model on device '{misses.device}' but {old_dir} holds one for device "
            f"'{old.device}'"
        )
    if misses.version > old_version:
        raise PrecompileError(
            f"{where} was recorded by version {misses.version} of '{misses.name}' but the newest version in "
            f"{os.path.dirname(old_dir)} is {old_version}: misses of another repository?"
        )
    for fm in misses.frames:
        frame = frame_of(old, fm.frame)
        if frame is None:
            raise PrecompileError(
                f"{where}: frame '{fm.frame}' is not a frame of {old_dir} (its frames: "
                f"{', '.join(f.name for f in old.frames)})"
            )
        if fm.is_entry != (fm.frame == old.entry_frame):
            raise PrecompileError(
                f"{where}: frame '{fm.frame}' is {'' if fm.is_entry else 'not '}the entry frame there, but "
                f"{old_dir}'s entry frame is '{old.entry_frame}'"
            )
        for i, ms in enumerate(fm.signatures):
            words = signature_words(fm.frame, ms.call, old.device)
            _check_signature(ms.call, frame, f"{where}: frame '{fm.frame}', signature {i + 1} ({words})")


def _module_of(model: Any) -> types.ModuleType:
    name = type(model).__module__ if isinstance(model, torch.nn.Module) else getattr(model, "__module__", "")
    module = sys.modules.get(name)
    if module is None:
        raise PrecompileError(f"cannot tell the module of the model ({name!r}) to find its frames in: pass frames")
    return module


def _default_frames(old: pb.Manifest, old_dir: str, model: Any, model_module: Optional[types.ModuleType]) -> List[Any]:
    names = [f.name for f in old.frames if f.name != old.entry_frame]
    if not names:
        return []
    try:
        return resolve_frames(names, model, model_module or _module_of(model))
    except PrecompileError as e:
        raise PrecompileError(
            f"the frames of {old_dir} ({', '.join(names)}) cannot all be found in the model: {e}; "
            "name them with --frames (frames=...)"
        ) from e


def _lost_coverage(old: pb.Manifest, new: pb.Manifest, judge: _Judge) -> List[Tuple[str, str]]:
    """The old version's captured calls an old entry variant covered that no
    new entry variant covers: (signature in words, old variant id)."""
    old_entry = frame_of(old, old.entry_frame)
    new_entry = frame_of(new, new.entry_frame)
    assert old_entry is not None and new_entry is not None
    lost = []
    for sig in old.captured_calls:
        old_variant = judge.covering_variant(old_entry, sig)
        if old_variant is not None and judge.covering_variant(new_entry, sig) is None:
            lost.append((signature_words(old.entry_frame, sig, old.device), old_variant))
    return lost


def _judge_miss(
    frame_name: str,
    ms: admin_pb2.MissSignature,
    new: pb.Manifest,
    version: int,
    judge: _Judge,
    recompile_limit: int,
    skipped: Mapping[bytes, str],
) -> MissResult:
    words = signature_words(frame_name, ms.call, new.device)
    result = functools.partial(
        MissResult, frame=frame_name, signature=words, count=ms.count,
        outcome=admin_pb2.MissOutcome.Name(ms.outcome),
    )
    frame = frame_of(new, frame_name)
    if frame is None:
        return result(status=NOT_COVERED, detail=f"version {version} has no frame '{frame_name}' (name it in --frames)")
    try:
        variant = judge.covering_variant(frame, ms.call)
    except PrecompileError as e:
        return result(status=NOT_COVERED, detail=f"it does not fit version {version}'s frame: {e}")
    if variant is not None:
        return result(status=COVERED, variant=variant)
    if frame.eager_fallback:
        name = pb.FallbackCause.Name(frame.fallback_cause)
        cause = FallbackCause(name).describe() if name in FallbackCause.__members__ else name
        first = frame.fallback_detail.splitlines()[0] if frame.fallback_detail else ""
        return result(status=EAGER, detail=f"{cause}: {first}")
    key = _signature_key(ms.call)
    if frame_name == new.entry_frame and key in skipped:
        return result(status=NOT_COVERED, detail=skipped[key])
    if frame_name != new.entry_frame:
        return result(
            status=NOT_COVERED,
            detail=(
                f"recapture replays calls of the entry frame only; the calls of '{frame_name}' come from "
                "eager runs of its caller, and no replayed call made one with this signature (give --calls "
                "that lead to it)"
            ),
        )
    if frame.truncated:
        return result(
            status=NOT_COVERED,
            detail=f"frame '{frame_name}' hit the recompile limit ({recompile_limit}); raise --recompile-limit",
        )
    return result(status=NOT_COVERED, detail=f"no variant of version {version} matches it")


# Calls to replay: what to call each in an error, and what makes its arguments.
_Replay = List[Tuple[str, Callable[[], Tuple[Sequence[Any], Mapping[str, Any]]]]]


def _checked_int_ranges(
    int_ranges: Optional[Mapping[str, Tuple[int, int]]], entry: pb.Frame, old_dir: str
) -> Dict[str, Tuple[int, int]]:
    """`int_ranges`, each naming a parameter of the entry frame and not empty."""
    ranges = dict(int_ranges or {})
    entry_names = [p.name for p in entry.parameters]
    for param, (lo, hi) in ranges.items():
        if param not in entry_names:
            raise PrecompileError(
                f"--int-range names '{param}', which is not a parameter of the entry frame '{entry.name}' "
                f"of {old_dir} (its parameters: {', '.join(entry_names)})"
            )
        if lo >= hi:
            raise PrecompileError(f"--int-range for '{param}': the range [{lo}, {hi}) is empty")
    return ranges


def _signature_key(sig: pb.CallSignature) -> bytes:
    """A missed signature's key in `skipped` and among those seen."""
    return sig.SerializeToString(deterministic=True)


def size_limits(frame: pb.Frame) -> Dict[str, Dict[Optional[int], int]]:
    """A frame's --max-size limits, as capture()'s max_sizes takes them."""
    limits: Dict[str, Dict[Optional[int], int]] = {}
    for limit in frame.size_limits:
        limits.setdefault(limit.parameter, {})[limit.dim if limit.HasField("dim") else None] = limit.max
    return limits


def _bounded_sizes(frame: pb.Frame) -> Dict[str, Dict[Optional[int], int]]:
    """Per parameter, the dimensions that every variant with a size symbol
    for them bounds, and the largest size any of them takes there.

    Such a bound is the capture's proof that a larger size reads past a
    table the model indexes (or fails a check of the model's own): no variant
    can serve it, and replaying it would run the model eagerly at a size a
    client chose, as large as a request may carry (a GPT-2 miss of 30 million
    token ids would allocate their embeddings before failing)."""
    largest: Dict[Tuple[str, int], int] = {}
    unbounded = set()
    for variant in frame.variants:
        maxima = {s.symbol: s.max for s in variant.symbols if s.HasField("max")}
        for guard in variant.guards:
            if guard.WhichOneof("check") != "tensor" or guard.tensor.is_none:
                continue
            name = frame.parameters[guard.parameter].name
            for d, dim in enumerate(guard.tensor.dims):
                if dim.WhichOneof("size") != "symbol":
                    continue
                if dim.symbol not in maxima:
                    unbounded.add((name, d))
                    continue
                bound = maxima[dim.symbol] + dim.symbol_offset
                largest[(name, d)] = max(largest.get((name, d), bound), bound)
    bounds: Dict[str, Dict[Optional[int], int]] = {}
    for (name, d), bound in largest.items():
        if (name, d) not in unbounded:
            bounds.setdefault(name, {})[d] = bound
    return bounds


def _past_size_limit(call: pb.CallSignature, limits: Mapping[str, Mapping[Optional[int], int]]) -> Optional[str]:
    """How a call's tensor passes a limit, in words, if one does."""
    for a in call.arguments:
        dims = limits.get(a.name)
        if dims is None or a.WhichOneof("value") != "tensor":
            continue
        for d, size in enumerate(a.tensor.shape):
            largest = limit_of(dims, d)
            if largest is not None and size > largest:
                return f"its '{a.name}' has {size} in dimension {d}, more than {largest}"
    return None


def _partly_sent_structure(call: pb.CallSignature, frame: pb.Frame) -> Optional[str]:
    """How a call sends some of a structure's tensors and not the others, in
    words, if it does. The server refuses such a call naming a missing one,
    and a structure rebuilt from some of its leaves is not one the frame was
    captured with (a cache of fewer layers), so replaying it would end the
    recapture."""
    sent = {a.name for a in call.arguments if a.WhichOneof("value") == "tensor"}
    leaves: Dict[str, List[str]] = {}
    for p in frame.parameters:
        if p.structure:
            leaves.setdefault(p.structure, []).append(p.name)
    for structure, names in leaves.items():
        missing = [name for name in names if name not in sent]
        if 0 < len(missing) < len(names):
            return (f"it sends {len(names) - len(missing)} of the {len(names)} tensors of '{structure}', "
                    f"not '{missing[0]}': a structure's tensors are sent all or none; not replayed")
    return None


def _entry_misses(
    proto: admin_pb2.MissesResponse, old: pb.Manifest
) -> Tuple[List[pb.CallSignature], Dict[bytes, str]]:
    """The entry frame's missed signatures a recapture can replay, each once,
    and why each of the others (by serialized signature) is not replayed."""
    entry_misses: List[pb.CallSignature] = []
    seen = set()
    skipped: Dict[bytes, str] = {}
    entry = frame_of(old, old.entry_frame)
    limits = size_limits(entry) if entry is not None else {}
    bounded = _bounded_sizes(entry) if entry is not None else {}
    for fm in proto.frames:
        if fm.frame != old.entry_frame:
            continue
        for ms in fm.signatures:
            key = _signature_key(ms.call)
            if key in seen:
                continue
            seen.add(key)
            off_device = [a.name for a in ms.call.arguments
                          if a.WhichOneof("value") == "tensor" and a.tensor.device != old.device]
            if off_device:
                skipped[key] = (
                    f"its tensor '{off_device[0]}' is not on '{old.device}', the device the variants are "
                    "compiled for, so no variant can take it; not replayed"
                )
                continue
            partly = _partly_sent_structure(ms.call, entry) if entry is not None else None
            if partly is not None:
                skipped[key] = partly
                continue
            past = _past_size_limit(ms.call, limits)
            if past is not None:
                skipped[key] = f"{past}, the largest the model's variants take (--max-size); not replayed"
                continue
            past = _past_size_limit(ms.call, bounded)
            if past is not None:
                skipped[key] = (f"{past}, the most any variant takes: a table the model indexes, or a check "
                                "of its own, ends there; not replayed")
                continue
            entry_misses.append(ms.call)
    return entry_misses, skipped


def _replay_plan(
    old: pb.Manifest,
    old_version: int,
    entry: pb.Frame,
    calls: Sequence[Tuple[Sequence[Any], Mapping[str, Any]]],
    entry_misses: List[pb.CallSignature],
    where: str,
    ranges: Mapping[str, Tuple[int, int]],
    model: Any,
    skipped: Dict[bytes, str],
) -> _Replay:
    """The calls to replay, in order, each with what to call it in an error
    and a function that makes its arguments.

    A miss that the model itself raises on, or answers with other outputs
    than the served model's, called eagerly with the values it will be
    replayed with, is not replayed but recorded in `skipped`: the server
    records any client's call, and one that sent floats where the model takes
    token ids, or labels it was never captured with, would otherwise end the
    recapture.

    A call that makes Dynamo give up on a frame ends that frame's compiles
    (Dynamo skips it from then on), so the calls version N compiled go first,
    then the misses (most frequent first, as the server lists them), and last
    the calls version N served eagerly, which may flag the frame again."""
    replay: _Replay = []
    covered_before = _Judge()
    compiled: List[Tuple[int, pb.CallSignature]] = []
    served_eagerly: List[Tuple[int, pb.CallSignature]] = []
    for i, sig in enumerate(old.captured_calls):
        covered = covered_before.covering_variant(entry, sig) is not None
        (compiled if covered else served_eagerly).append((i, sig))

    def add_captured(i: int, sig: pb.CallSignature) -> None:
        words = signature_words(old.entry_frame, sig, old.device)
        replay.append((f"captured call {i} of version {old_version}, {words}",
                       _maker(sig, entry, i, ranges)))

    for i, sig in compiled:
        add_captured(i, sig)
    for i, (args, kwargs) in enumerate(calls):
        replay.append((f"extra call {i}", lambda args=args, kwargs=kwargs: (args, kwargs)))
    for j, sig in enumerate(entry_misses):
        words = signature_words(old.entry_frame, sig, old.device)
        make = _maker(sig, entry, len(old.captured_calls) + j, ranges)
        rejection = _rejection(model, make, entry)
        if rejection is not None:
            skipped[_signature_key(sig)] = rejection
            continue
        replay.append((f"the missed signature {words} ({where})", make))
    for i, sig in served_eagerly:
        add_captured(i, sig)
    return replay


def _rejection(model: Any, make: Callable[[], Tuple[List[Any], Dict[str, Any]]], entry: pb.Frame) -> Optional[str]:
    """Why a missed call is not replayed, if the model raises on it or
    returns other outputs than the served model's (an optional argument the
    example calls never passed, such as labels, that adds a loss): a frame
    returns the same outputs on every call, so the recapture would end there."""
    try:
        args, kwargs = make()
    except PrecompileError:
        return None  # The replay names it.
    result, error = _call_eagerly(model, args, kwargs)
    if error is not None:
        return (f"the model raises {type(error).__name__} on it ({first_lines(str(error)).splitlines()[0]}), "
                "called eagerly with values made from its signature; not replayed")
    try:
        schema = output_schema(entry.name, result)
    except PrecompileError as e:
        return f"{first_lines(str(e)).splitlines()[0]}; not replayed"
    served = outputs_from_proto(entry.outputs)
    if served.leaves and schema != served:
        return (f"the model returns {schema.describe()} for it, where the served model returns "
                f"{served.describe()}: a served model returns the same outputs on every call; not replayed")
    return None


def _replay(
    cap: Any,
    replay: _Replay,
    model: Any,
    model_dir: str,
) -> None:
    """Runs each call of `replay` through the capture `cap`; PrecompileError
    names the call that failed, with the model's own error where it has one."""
    for what, make in replay:
        try:
            args, kwargs = make()
        except PrecompileError as e:
            raise PrecompileError(f"recapture of {model_dir}: {what}: {e}") from e
        try:
            cap(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - named with the call that raised it
            error = e if not isinstance(e, PrecompileError) else _model_error(model, args, kwargs)
            if error is None:
                raise PrecompileError(f"recapture of {model_dir}: {what}: {e}") from e
            raise PrecompileError(
                f"recapture of {model_dir}: the model rejects {what}: {type(error).__name__}: "
                f"{first_lines(str(error))}"
            ) from error


def recapture(
    model: Union[torch.nn.Module, Callable[..., Any]],
    repository: Union[str, "os.PathLike[str]"],
    misses: Union[str, "os.PathLike[str]", admin_pb2.MissesResponse],
    *,
    name: Optional[str] = None,
    device: Optional[str] = None,
    frames: Optional[Sequence[Union[str, Callable[..., Any], torch.nn.Module]]] = None,
    model_module: Optional[types.ModuleType] = None,
    calls: Sequence[Tuple[Sequence[Any], Mapping[str, Any]]] = (),
    int_ranges: Optional[Mapping[str, Tuple[int, int]]] = None,
    recompile_limit: int = 8,
    eager: str = "auto",
    allow_incomplete: bool = False,
) -> RecaptureReport:
    """Captures `model` again into the next version of `repository`
    (REPOSITORY/MODEL), covering the entry calls the server missed.

    Args:
      model: the model (as for capture()); an nn.Module is moved to the
        previous version's device.
      repository: the model's directory in the server's repository; its
        newest numeric version N is the previous version, N+1 is written.
      misses: the server's MissesResponse: a path to its JSON (what the admin
        Misses call returns) or the message.
      name: the model name of the new version; the previous version's.
      device: must be the previous version's device (the default).
      frames: sub-frames as for capture(); by default the previous version's
        sub-frames, found by name as the command line's --frames finds them
        (sub-module paths, functions of `model_module`, by default the
        module defining the model).
      calls: extra (args, kwargs) example calls, replayed after the previous
        version's captured calls (required when it recorded none).
      int_ranges: per entry parameter name, the [low, high) of the values of
        an integer tensor made up for it; [0, 2) otherwise.
      recompile_limit, eager, allow_incomplete: as for capture() and save().

    Returns a RecaptureReport. Raises PrecompileError, leaving the repository
    as it was, for misses of another model, torch or device, signatures that
    do not fit the entry frame, a replayed call the model raises on (a miss
    it raises on or answers with other outputs is not replayed, and misses
    that all are so are an error), a new
    version that would not cover a captured call the previous one covered,
    or an incomplete capture (unless allow_incomplete).
    """
    model_dir = os.path.abspath(os.fspath(repository))
    old_version, old_dir = newest_version(model_dir)
    old = read_manifest(old_dir)
    proto, where = load_misses(misses)
    _check_misses(proto, where, old, old_dir, old_version)
    if device is not None and device != old.device:
        raise PrecompileError(
            f"device '{device}' differs from the device of {old_dir} ('{old.device}'); a recapture keeps "
            "the previous version's device"
        )
    entry = frame_of(old, old.entry_frame)
    assert entry is not None
    ranges = _checked_int_ranges(int_ranges, entry, old_dir)
    if not old.captured_calls and not calls:
        raise PrecompileError(
            f"{os.path.join(old_dir, MANIFEST)} records no captured calls (version {old_version} was "
            "captured before precompile_capture recorded them), and a recapture replays them first so that "
            f"version {old_version + 1} keeps what version {old_version} covers: give the calls version "
            f"{old_version} was captured from with --calls (calls= in the API)"
        )
    entry_misses, skipped = _entry_misses(proto, old)
    if not entry_misses and not calls:
        raise PrecompileError(
            f"{where} records no missed call of the entry frame '{old.entry_frame}' that a recapture can "
            "replay, and no extra calls were given: nothing to recapture"
        )

    if isinstance(model, torch.nn.Module):
        model = model.to(old.device)
    replay = _replay_plan(old, old_version, entry, calls, entry_misses, where, ranges, model, skipped)
    replayed_misses = len(replay) - len(old.captured_calls) - len(calls)
    if not replayed_misses and not calls:
        raise PrecompileError(
            f"{where}: no missed call of the entry frame '{old.entry_frame}' can be replayed (the model, "
            "called eagerly with values made from each signature, raises on it or returns other outputs), "
            "and no extra calls were given: nothing to recapture (" + "; ".join(
                f"{signature_words(old.entry_frame, sig, old.device)}: "
                f"{skipped[_signature_key(sig)]}" for sig in entry_misses) + ")")

    if frames is None:
        frames = _default_frames(old, old_dir, model, model_module)
    name = name or old.model_name
    cap = capture(model, name=name, device=old.device, frames=frames, recompile_limit=recompile_limit,
                  eager=eager, max_sizes=size_limits(entry))
    new_version = old_version + 1
    target = os.path.join(model_dir, str(new_version))
    try:
        _replay(cap, replay, model, model_dir)
        if os.path.lexists(target):
            raise PrecompileError(f"{target} exists already: another capture wrote version {new_version}")
        staging = tempfile.mkdtemp(prefix=".recapture-", dir=model_dir)
        try:
            cap.save(staging, require_complete=False)
            new = read_manifest(staging)
            judge = _Judge()
            lost = _lost_coverage(old, new, judge)
            if lost:
                entry_new = frame_of(new, new.entry_frame)
                hint = (
                    f" (frame '{new.entry_frame}' hit recompile_limit={recompile_limit}: raise it)"
                    if entry_new is not None and entry_new.truncated else ""
                )
                raise PrecompileError(
                    f"recapture of {model_dir} would lose coverage: version {new_version} covers none of "
                    + "; ".join(f"{w} (covered by version {old_version}'s variant {v})" for w, v in lost)
                    + f"{hint}; nothing was written"
                )
            if not allow_incomplete:
                message = cap.incompleteness_message()
                if message is not None:
                    raise PrecompileError(f"recapture of {model_dir}: {message}")
            results = tuple(
                _judge_miss(fm.frame, ms, new, new_version, judge, recompile_limit, skipped)
                for fm in proto.frames
                for ms in fm.signatures
            )
            try:
                _rename_noreplace(staging, target)
            except FileExistsError:
                raise PrecompileError(
                    f"{target} appeared during the recapture: another capture wrote version {new_version}"
                ) from None
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    finally:
        cap.close()
    return RecaptureReport(
        model_name=name,
        directory=target,
        version=new_version,
        previous_version=old_version,
        misses_version=proto.version,
        replayed_captured=len(old.captured_calls),
        replayed_extra=len(calls),
        replayed_misses=replayed_misses,
        variants_per_frame={f.name: len(f.variants) for f in new.frames},
        eager_fallbacks=tuple(new.summary.eager_fallbacks),
        complete=new.summary.complete,
        results=results,
        other_calls={fm.frame: fm.other_calls for fm in proto.frames if fm.other_calls},
    )


def _call_eagerly(model: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Tuple[Any, Optional[Exception]]:
    """What the model returns for a call, run eagerly, or the exception it raises."""
    try:
        with torch.no_grad():
            return model(*args, **kwargs), None
    except Exception as e:  # noqa: BLE001 - the caller names it
        return None, e


def _model_error(model: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Optional[BaseException]:
    """The exception the model itself raises on a call the capture failed on,
    if it does: a made-up call the model cannot take (wrong sizes, say) fails
    the capture's export before the model's own, clearer, error is seen."""
    return _call_eagerly(model, args, kwargs)[1]


def _maker(
    sig: pb.CallSignature, frame: pb.Frame, seed: int, int_ranges: Mapping[str, Tuple[int, int]]
) -> Callable[[], Tuple[List[Any], Dict[str, Any]]]:
    return lambda: call_from_signature(sig, frame, seed, int_ranges)
