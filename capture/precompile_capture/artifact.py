"""Writing a capture as an artifact directory (the contract with the runtime).

Layout (every path relative and '/'-separated):

    MANIFEST.pb                  binary precompile.artifact.v1.Manifest
    FRAMES                       the readable list of frames and variants
    frames/<frame>/eager.pt      a flagged frame's eager program (TorchScript)
    frames/<frame>/python.pt     or its Python eager program (python_program.py)
    frames/<frame>/<n>.pt2       the AOTInductor package of variant n

`<frame>` is the frame name with every character outside [A-Za-z0-9_-]
replaced by '_' (made unique). The manifest lists every other file with its
SHA-256 and size. The directory is written beside the target and renamed into
place; an existing target is replaced only if it is empty or an artifact.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import os
import re
import shutil
import tempfile
import warnings
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
import torch.utils._pytree as pytree

from proto import artifact_pb2 as pb

from . import __version__, python_program
from .called_operators import manifest_operators
from .errors import PrecompileError
from .frames import Binding, Frame, Kind
from .export_guards import SizeRelation
from .guards import ArgGuard, Dim, GuardSet, SymbolRange, TensorSpec
from .outputs import Leaf, OutputSchema
from .summary import PrecompileSummary

MANIFEST = "MANIFEST.pb"
FRAMES = "FRAMES"

_DTYPES = {
    torch.bool: pb.DTYPE_BOOL,
    torch.uint8: pb.DTYPE_UINT8,
    torch.int8: pb.DTYPE_INT8,
    torch.int16: pb.DTYPE_INT16,
    torch.int32: pb.DTYPE_INT32,
    torch.int64: pb.DTYPE_INT64,
    torch.float16: pb.DTYPE_FLOAT16,
    torch.bfloat16: pb.DTYPE_BFLOAT16,
    torch.float32: pb.DTYPE_FLOAT32,
    torch.float64: pb.DTYPE_FLOAT64,
}
_DTYPES_FROM_PROTO = {v: k for k, v in _DTYPES.items()}
_BINDINGS = {b: pb.Parameter.Binding.Value(b.value) for b in Binding}
_KINDS = {
    Kind.TENSOR: pb.Parameter.TENSOR,
    Kind.INT: pb.Parameter.INT,
    Kind.FLOAT: pb.Parameter.FLOAT,
    Kind.BOOL: pb.Parameter.BOOL,
    Kind.STRING: pb.Parameter.STRING,
    Kind.OPTIONAL_TENSOR: pb.Parameter.OPTIONAL_TENSOR,
}


@dataclasses.dataclass(frozen=True)
class ArtifactContents:
    """What a capture saves: plain data for the writer."""

    name: str
    device: str
    recompile_limit: int
    frames: Sequence[Frame]  # The entry first.
    summary: PrecompileSummary
    # The eager program files of the flagged frames, by frame name.
    eager_programs: Dict[str, str]
    # The entry calls that ran, in order, as capture.call_record() describes
    # them (repeats included; the manifest keeps each signature once).
    captured_calls: Sequence[Dict[str, Any]] = ()
    # The Python eager program files of the flagged frames, by frame name, and
    # what they need of the server's Python: (version, [(module, version)]).
    python_programs: Dict[str, str] = dataclasses.field(default_factory=dict)
    python_environment: Optional[Tuple[str, List[Tuple[str, str]]]] = None
    # Per frame with a Python eager program: the code it carries by value
    # (python_program.CodeByValue).
    code_by_value: Dict[str, Sequence[Any]] = dataclasses.field(default_factory=dict)


def dtype_to_proto(dtype: torch.dtype) -> int:
    try:
        return _DTYPES[dtype]
    except KeyError:
        raise PrecompileError(f"dtype {dtype} has no name in the artifact format") from None


def dtype_from_proto(value: int, where: str) -> torch.dtype:
    """The torch dtype a DType names; `where` says what named it, for the error."""
    try:
        return _DTYPES_FROM_PROTO[value]
    except KeyError:
        name = pb.DType.Name(value) if value in pb.DType.values() else str(value)
        raise PrecompileError(f"{where}: dtype {name} is not one the artifact format names") from None


def scalar_value(s: pb.Scalar, where: str) -> Any:
    """The Python value of a Scalar (the inverse of scalar())."""
    which = s.WhichOneof("value")
    if which is None:
        raise PrecompileError(f"{where}: a scalar with no value (none, bool, int, float or string)")
    if which == "none":
        return None
    return getattr(s, which)


def scalar(value: Any, kind: Kind) -> pb.Scalar:
    s = pb.Scalar()
    if value is None:
        s.none = True
    elif isinstance(value, bool):
        s.bool_value = value
    elif kind is Kind.FLOAT and isinstance(value, (int, float)):
        s.float_value = float(value)
    elif isinstance(value, int):
        s.int_value = value
    elif isinstance(value, float):
        s.float_value = value
    elif isinstance(value, str):
        s.string_value = value
    else:
        raise PrecompileError(f"{value!r} is not a scalar the artifact format can record")
    return s


def frame_dir_names(frames: List[Frame]) -> Dict[str, str]:
    out: Dict[str, str] = {}
    used = set()
    for frame in frames:
        base = re.sub(r"[^A-Za-z0-9_-]", "_", frame.name) or "frame"
        name, n = base, 2
        while name in used:
            name, n = f"{base}_{n}", n + 1
        used.add(name)
        out[frame.name] = name
    return out


def guards_proto(variant_proto: pb.Variant, guards: GuardSet, kinds: Sequence[Kind]) -> None:
    """Writes `guards` into `variant_proto`; `kinds` are the frame's
    parameters' kinds, which say how a None or a number is written."""
    for g in guards.args:
        ag = variant_proto.guards.add()
        ag.parameter = g.parameter
        kind = kinds[g.parameter]
        if g.tensor is not None:
            ag.tensor.dtype = dtype_to_proto(g.tensor.dtype)
            ag.tensor.device = g.tensor.device
            for dim in g.tensor.dims:
                d = ag.tensor.dims.add()
                if dim.symbol is None:
                    d.static_size = dim.static
                else:
                    d.symbol = dim.symbol
                    d.symbol_offset = dim.offset
        elif g.is_none:
            if kind.is_tensor:
                ag.tensor.is_none = True
            else:
                ag.equals.CopyFrom(scalar(None, kind))
        else:
            ag.equals.CopyFrom(scalar(g.value, kind))
    for s in guards.symbols:
        r = variant_proto.symbols.add()
        r.symbol = s.symbol
        r.min = s.min
        if s.max is not None:
            r.max = s.max
        r.name = s.name
    for relation in guards.size_relations:
        rp = variant_proto.size_relations.add()
        size_program_proto(rp.left, relation.left)
        rp.comparison = pb.SizeRelation.Comparison.Value(relation.comparison)
        size_program_proto(rp.right, relation.right)
        rp.text = relation.text
    variant_proto.global_state.grad_enabled = guards.grad_enabled
    variant_proto.global_state.default_dtype = dtype_to_proto(guards.default_dtype)


def guards_from_proto(variant_proto: pb.Variant) -> GuardSet:
    """The GuardSet a manifest's variant records: the inverse of guards_proto,
    so that GuardSet.holds (the capture's dispatch, which the differential
    tests compare with the runtime's guards) judges a signature against a
    saved artifact exactly as it judged calls during the capture."""
    where = f"variant {variant_proto.id}"
    args: List[ArgGuard] = []
    for g in variant_proto.guards:
        which = g.WhichOneof("check")
        if which == "tensor" and g.tensor.is_none:
            args.append(ArgGuard(parameter=g.parameter, is_none=True))
        elif which == "tensor":
            dims = tuple(
                Dim(static=d.static_size) if d.WhichOneof("size") == "static_size"
                else Dim(symbol=d.symbol, offset=d.symbol_offset)
                for d in g.tensor.dims
            )
            spec = TensorSpec(
                dtype=dtype_from_proto(g.tensor.dtype, f"{where}, parameter {g.parameter}"),
                device=g.tensor.device,
                dims=dims,
            )
            args.append(ArgGuard(parameter=g.parameter, tensor=spec))
        elif which == "equals":
            value = scalar_value(g.equals, f"{where}, parameter {g.parameter}")
            if value is None:
                args.append(ArgGuard(parameter=g.parameter, is_none=True))
            else:
                args.append(ArgGuard(parameter=g.parameter, has_value=True, value=value))
        else:
            raise PrecompileError(f"{where}: the guard on parameter {g.parameter} checks nothing")
    symbols = tuple(
        SymbolRange(symbol=r.symbol, min=r.min, max=r.max if r.HasField("max") else None, name=r.name)
        for r in variant_proto.symbols
    )
    relations = tuple(
        SizeRelation(left=_size_steps(r.left), comparison=pb.SizeRelation.Comparison.Name(r.comparison),
                     right=_size_steps(r.right), text=r.text)
        for r in variant_proto.size_relations
    )
    return GuardSet(
        args=tuple(args),
        symbols=symbols,
        grad_enabled=variant_proto.global_state.grad_enabled,
        default_dtype=dtype_from_proto(variant_proto.global_state.default_dtype, f"{where}, global state"),
        size_relations=relations,
    )


def _size_steps(program: pb.SizeProgram) -> Tuple[Tuple[str, Any], ...]:
    """The steps of a size program as guards.size_program writes them."""
    steps = []
    for step in program.steps:
        kind = step.WhichOneof("step")
        steps.append((kind, pb.SizeProgram.Op.Name(step.op) if kind == "op" else getattr(step, kind)))
    return tuple(steps)


def _dumped_tree_spec(spec: pytree.TreeSpec) -> str:
    """The spec as torch serializes it; empty for a structure torch cannot
    serialize (a node type registered without a serialized name)."""
    try:
        return pytree.treespec_dumps(spec)
    except Exception:  # noqa: BLE001 - whatever the node's context does
        return ""


def call_signature(frame: Frame, record: Dict[str, Any]) -> pb.CallSignature:
    """A captured entry call (capture.call_record()) as a CallSignature of the
    frame's final parameters: an entry of **kwargs or a structure first seen
    after the call was absent from it (None), and a FLOAT parameter's int is
    a float, as the runtime's guards (and so the server's misses) see them."""
    sig = pb.CallSignature()
    for p in frame.params:
        arg = sig.arguments.add()
        arg.name = p.name
        item = record.get(p.name, ("value", None))
        if item[0] == "tensor":
            _, dtype, device, shape = item
            arg.tensor.dtype = dtype_to_proto(dtype)
            arg.tensor.device = device
            arg.tensor.shape.extend(shape)
        else:
            arg.scalar.CopyFrom(scalar(item[1], p.final_kind()))
    return sig


def captured_calls_proto(frame: Frame, records: Sequence[Dict[str, Any]]) -> List[pb.CallSignature]:
    """The distinct signatures of `records`, in the order first seen."""
    out: List[pb.CallSignature] = []
    seen = set()
    for record in records:
        sig = call_signature(frame, record)
        key = sig.SerializeToString(deterministic=True)
        if key not in seen:
            seen.add(key)
            out.append(sig)
    return out


def index_ranges(frame: Frame) -> Dict[int, Tuple[int, int]]:
    """Per parameter, the values every variant's compiled code can index with."""
    ranges: Dict[int, Tuple[int, int]] = {}
    for v in frame.variants:
        for i, lo, hi in v.guards.index_ranges:
            if i in ranges:
                lo, hi = max(lo, ranges[i][0]), min(hi, ranges[i][1])
            ranges[i] = (lo, hi)
    return ranges


def frames_text(contents: ArtifactContents) -> str:
    """The readable FRAMES list."""
    lines = [
        f"# precompile artifact: model {contents.name}, torch {torch.__version__}, "
        f"device {contents.device}, cpu isa {torch.backends.cpu.get_cpu_capability()}"
    ]
    for frame in contents.frames:
        n = len(frame.variants)
        row = f"{frame.name}: {n} variant{'' if n == 1 else 's'}"
        if frame.eager_fallback:
            assert frame.fallback_cause is not None
            short = frame.fallback_detail.splitlines()[0] if frame.fallback_detail else ""
            if len(short) > 120:
                short = short[:117] + "..."
            row += f" # eager fallback ({frame.fallback_cause.value}: {short})"
            if frame.variantless_entry_fallback:
                row += " # variantless entry: nothing to dispatch to"
            else:
                # The frame's choice, known before save() writes any program.
                row += f" # eager program: {'Python' if frame.eager_program == 'python' else 'TorchScript'}"
        elif not frame.variants:
            if frame.compile_error:
                row += " # uncovered (compile error suppressed)"
            else:
                row += " # uncovered (no variant)"
        elif frame.compile_error:
            row += " # incomplete (compile error suppressed: the calls after it were not captured)"
        if frame.truncated:
            row += f" # truncated (recompile limit {contents.recompile_limit} hit)"
        lines.append(row)
        names = [p.name for p in frame.params]
        for code in contents.code_by_value.get(frame.name, []):
            lines.append(f"  Python by value: {code.module}: {', '.join(code.qualified_names)} "
                         f"(sha256 {code.sha256[:16]})")
        for v in frame.variants:
            lines.append(f"  {v.id}: {v.guards.describe(names, contents.device)}")
            for check in v.guards.index_checks:
                lines.append(f"    checks as it runs: {check}")
        for param_name, dims in frame.size_limits.items():
            for dim, size in dims.items():
                where = "every dimension" if dim is None else f"dimension {dim}"
                lines.append(f"  {param_name}: {where} at most {size} (--max-size)")
        for i, (lo, hi) in index_ranges(frame).items():
            lines.append(f"  {frame.params[i].name}: values in [{lo}, {hi}) (indices into a table)")
        if frame.outputs is not None:
            lines.append(f"  returns {frame.outputs.describe()}")
    return "\n".join(lines) + "\n"


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def outputs_from_proto(outputs: pb.OutputStructure) -> OutputSchema:
    """A frame's outputs as _outputs_proto wrote them (without the pytree spec
    itself, which the manifest keeps only in words)."""
    return OutputSchema(tuple(Leaf(leaf.name, leaf.is_tensor, leaf.python_type) for leaf in outputs.leaves),
                        outputs.tree_spec)


def _outputs_proto(f: pb.Frame, frame: Frame, eager_program: str) -> None:
    if frame.outputs is not None:
        for leaf in frame.outputs.leaves:
            lp = f.outputs.leaves.add()
            lp.name = leaf.name
            lp.is_tensor = leaf.is_tensor
            lp.python_type = leaf.python_type
        f.outputs.tree_spec = frame.outputs.tree_spec
        return
    # Never called by the example calls: no variant, and a flagged frame's
    # TorchScript says what it returns.
    if eager_program:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            returns = torch.jit.load(eager_program).forward.schema.returns[0].type
        n = len(returns.elements()) if isinstance(returns, torch._C.TupleType) else 1
        for i in range(n):
            lp = f.outputs.leaves.add()
            lp.name = f"output{i}"
            lp.is_tensor = True
        f.outputs.tree_spec = str(returns)


def size_program_proto(out: pb.SizeProgram, steps) -> None:
    """Writes a size program (guards.size_program) into `out`."""
    for kind, value in steps:
        step = out.steps.add()
        if kind == "constant":
            step.constant = value
        elif kind == "symbol":
            step.symbol = value
        else:
            step.op = pb.SizeProgram.Op.Value(value)


def build_manifest(contents: ArtifactContents, root: str, dirs: Dict[str, str]) -> pb.Manifest:
    m = pb.Manifest()
    m.format_version = pb.FORMAT_VERSION_2
    m.torch_version = torch.__version__
    m.device = contents.device
    m.cpu_isa = torch.backends.cpu.get_cpu_capability()
    m.model_name = contents.name
    m.entry_frame = contents.frames[0].name
    for frame in contents.frames:
        f = m.frames.add()
        f.name = frame.name
        for p in frame.params:
            pp = f.parameters.add()
            pp.name = p.name
            kind = p.final_kind()
            pp.kind = _KINDS[kind]
            if p.has_default:
                pp.default_value.CopyFrom(scalar(p.default, kind))
            if p.example_dtype is not None:
                pp.example_dtype = dtype_to_proto(p.example_dtype)
            pp.binding = _BINDINGS[p.binding]
            pp.passed = p.passed
            pp.structure = p.tree
        structures: Dict[str, pb.Structure] = {}
        for name, spec in frame.trees.items():
            structures[name] = f.structures.add(parameter=name, tree_spec=_dumped_tree_spec(spec))
        for name, spec in frame.empty_trees.items():
            if name not in structures:
                structures[name] = f.structures.add(parameter=name)
            structures[name].empty_tree_spec = _dumped_tree_spec(spec)
        for param_name, dims in frame.size_limits.items():
            if all(p.name != param_name for p in frame.params):
                raise PrecompileError(
                    f"max_sizes names '{param_name}', which no call passed to the entry frame "
                    f"'{frame.name}' (its parameters: {', '.join(p.name for p in frame.params)})")
            for dim, size in dims.items():
                limit = f.size_limits.add(parameter=param_name, max=size)
                if dim is not None:
                    limit.dim = dim
        for i, (lo, hi) in index_ranges(frame).items():
            f.parameters[i].index_range.min = lo
            f.parameters[i].index_range.max = hi
        _outputs_proto(f, frame, contents.eager_programs.get(frame.name, ""))
        for v in frame.variants:
            vp = f.variants.add()
            vp.id = v.id
            vp.package_path = f"frames/{dirs[frame.name]}/{v.index}.pt2"
            guards_proto(vp, v.guards, [p.final_kind() for p in frame.params])
            vp.tensor_inputs.extend(v.tensor_inputs)
            vp.num_outputs = len(v.leaf_kinds)
            for dtype, shape, symbols, programs in v.outputs:
                out = vp.outputs.add()
                out.dtype = dtype_to_proto(dtype)
                out.shape.extend(shape)
                out.shape_symbols.extend(symbols)
                if any(programs):
                    for program in programs:
                        size_program_proto(out.shape_programs.add(), program or [])
            vp.captured_from = v.captured_from
            vp.index_checks.extend(v.guards.index_checks)
        f.eager_fallback = frame.eager_fallback
        if frame.fallback_cause is not None:
            f.fallback_cause = pb.FallbackCause.Value(frame.fallback_cause.value)
        f.fallback_detail = frame.fallback_detail
        if frame.name in contents.eager_programs:
            f.eager_program_path = f"frames/{dirs[frame.name]}/eager.pt"
        if frame.name in contents.python_programs:
            f.python_program.path = f"frames/{dirs[frame.name]}/python.pt"
            for code in contents.code_by_value.get(frame.name, []):
                f.python_program.code_by_value.add(
                    module=code.module, qualified_names=code.qualified_names, sha256=code.sha256)
        f.truncated = frame.truncated
        f.variantless_entry_fallback = frame.variantless_entry_fallback
    s = contents.summary
    m.summary.frames.extend(s.frames)
    for name, count in s.variants_per_frame.items():
        m.summary.variants_per_frame[name] = count
    m.summary.eager_fallbacks.extend(s.eager_fallbacks)
    m.summary.uncovered_frames.extend(s.uncovered_frames)
    m.summary.truncated = s.truncated
    m.summary.complete = s.complete
    m.captured_calls.extend(captured_calls_proto(contents.frames[0], contents.captured_calls))
    operators = manifest_operators(
        contents.name, [op for frame in contents.frames for v in frame.variants for op in v.operators])
    for name, module in operators.items():
        m.operators.add(name=name, python_module=module)
    environment = contents.python_environment
    operator_modules = {module for module in operators.values() if module}
    if operator_modules:
        # The server's interpreter imports them: it needs their packages too.
        version, extra = python_program.environment(operator_modules)
        environment = (version, sorted(set(environment[1] if environment else []) | set(extra)))
    if environment is not None:
        m.python.python_version, modules = environment
        for name, version in modules:
            m.python.modules.add(name=name, version=version)
    for rel in sorted(_files(root)):
        if rel == MANIFEST:
            continue
        path = os.path.join(root, *rel.split("/"))
        fd = m.files.add()
        fd.path = rel
        fd.sha256 = _sha256(path)
        fd.size_bytes = os.path.getsize(path)
    m.created_at = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    m.capture_version = __version__
    return m


def _files(root: str) -> List[str]:
    out = []
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            rel = os.path.relpath(os.path.join(dirpath, name), root)
            out.append(rel.replace(os.sep, "/"))
    return out


def _check_target(target: str) -> None:
    if os.path.lexists(target):
        if not os.path.isdir(target) or os.path.islink(target):
            raise PrecompileError(f"cannot write the artifact to {target}: it exists and is not a directory")
        if os.listdir(target) and not os.path.isfile(os.path.join(target, MANIFEST)):
            raise PrecompileError(
                f"cannot write the artifact to {target}: the directory is not empty and holds no "
                f"{MANIFEST} (not a previous artifact); refusing to overwrite it"
            )


def write_artifact(contents: ArtifactContents, directory: str) -> str:
    target = os.path.abspath(directory)
    _check_target(target)
    parent = os.path.dirname(target)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(target)}.tmp-", dir=parent)
    try:
        dirs = frame_dir_names(list(contents.frames))
        for frame in contents.frames:
            frame_dir = os.path.join(tmp, "frames", dirs[frame.name])
            if frame.variants or frame.name in contents.eager_programs or frame.name in contents.python_programs:
                os.makedirs(frame_dir)
            if frame.name in contents.eager_programs:
                shutil.copyfile(contents.eager_programs[frame.name], os.path.join(frame_dir, "eager.pt"))
            if frame.name in contents.python_programs:
                shutil.copyfile(contents.python_programs[frame.name], os.path.join(frame_dir, "python.pt"))
            for v in frame.variants:
                shutil.copyfile(v.package, os.path.join(frame_dir, f"{v.index}.pt2"))
        with open(os.path.join(tmp, FRAMES), "w") as f:
            f.write(frames_text(contents))
        manifest = build_manifest(contents, tmp, dirs)
        with open(os.path.join(tmp, MANIFEST), "wb") as f:
            f.write(manifest.SerializeToString())
        for dirpath, dirnames, filenames in os.walk(tmp):
            os.chmod(dirpath, 0o755)
            for name in filenames:
                os.chmod(os.path.join(dirpath, name), 0o644)
        _check_target(target)
        if os.path.isdir(target) and os.listdir(target):
            old = tempfile.mkdtemp(prefix=f".{os.path.basename(target)}.old-", dir=parent)
            os.rename(target, os.path.join(old, "artifact"))
            os.rename(tmp, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, target)  # Replaces an empty directory too.
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target
