"""Command line: capture a model on example calls and write its artifact, or
recapture a served model from the calls its server missed.

    python -m precompile_capture --model pkg.module:factory --calls calls.json \\
        --name NAME --out DIR [--device cpu] [--frames a,b] [--eager auto|torchscript|python]
        [--static-shapes] [--max-size NAME[.DIM]=N ...] [--suppress-errors] [--allow-incomplete]

    python -m precompile_capture --model pkg.module:factory \\
        --recapture REPOSITORY/MODEL --misses misses.json [--int-range NAME=LO:HI ...] \\
        [--calls extra.json] [--frames a,b] [--recompile-limit N] [--eager ...] [--allow-incomplete]

`factory` is called with no arguments and returns the model (an nn.Module or a
function); an nn.Module instance named directly is used as is. calls.json is a
list of {"args": [...], "kwargs": {...}}; a tensor is written
{"tensor": {"shape": [8, 4], "dtype": "float32", "seed": 0}} (deterministic
random values: normal for floating dtypes, integers in [low, high) -- default
[0, 10) -- for integer dtypes, 0/1 for bool) or
{"tensor": {"values": [[1, 2], [3, 4]], "dtype": "float32"}};
{"output_of": {"call": 0, "path": "past_key_values"}} is what an earlier
call returned, at a path of attribute names, keys and indices joined by "."
(a decoder's cache passed back: its next call);
{"made_by": "pkg.module:function"} is what that function returns, called
with no arguments for each call (an empty cache, as model.generate() makes
it for a first call); any other JSON value is passed as the Python value
(numbers, strings, booleans, null).
A frame in --frames is a sub-module path, a function of the model's module
named by its name, or "pkg.module:function".

Recapture (precompile_capture.recapture) writes the next version of a model
in the server's repository. It reads the newest numeric version N of
REPOSITORY/MODEL and the misses file: the JSON of the server's
precompile.v1.MissesResponse (proto/admin.proto, what the admin Misses call
returns; field names snake_case or camelCase, int64 as strings): per frame,
the distinct signatures of the calls no variant matched (per parameter, a
tensor's dtype, device and shape or a non-tensor's value), each with its count
and outcome. The misses must come from the same model_name, torch version and
device as version N. The model is captured again replaying, in order, the
entry calls version N was captured from (its manifest's captured_calls; an
artifact captured before they were recorded needs --calls), the calls of
--calls, and every distinct missed signature of the entry frame, each call
made up from its signature: floating tensors random normal (a fixed seed),
integer tensors uniform in [LO, HI) of --int-range NAME=LO:HI for the
parameter NAME (default [0, 2)), bool tensors False, scalars their value.
Misses of sub-frames are not replayed (their calls come from eager runs of
their caller). --name defaults to version N's model_name, the device to its
device and --frames to its sub-frames. Version N+1 is written under a name the
server's scan ignores and renamed to REPOSITORY/MODEL/<N+1> in one step; a
recapture that would not cover a captured call version N covered is refused.
Then each recorded miss is listed with whether version N+1 covers it (by its
guards), stays eager (its frame is an eager fallback), or is not covered, and
why. Any error leaves the repository as it was.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import sys
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from .capture import capture
from .errors import PrecompileError
from .names import import_object, resolve_frames

_DTYPES = {
    "bool": torch.bool,
    "uint8": torch.uint8,
    "int8": torch.int8,
    "int16": torch.int16,
    "int32": torch.int32,
    "int64": torch.int64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
    "float64": torch.float64,
}


def make_tensor(spec: Dict[str, Any], device: str = "cpu") -> torch.Tensor:
    if not isinstance(spec, dict):
        raise PrecompileError(f"a tensor spec is an object, not {spec!r}")
    dtype_name = spec.get("dtype", "float32")
    if dtype_name not in _DTYPES:
        raise PrecompileError(f"unknown dtype {dtype_name!r}; one of {sorted(_DTYPES)}")
    dtype = _DTYPES[dtype_name]
    if "values" in spec:
        return torch.tensor(spec["values"], dtype=dtype, device=device)
    shape = spec.get("shape")
    if not isinstance(shape, list) or not all(isinstance(s, int) and s >= 0 for s in shape):
        raise PrecompileError(f"a tensor spec needs \"shape\" (a list of sizes) or \"values\": {spec!r}")
    generator = torch.Generator().manual_seed(int(spec.get("seed", 0)))
    if dtype.is_floating_point:
        t = torch.randn(shape, generator=generator, dtype=torch.float32).to(dtype)
    elif dtype is torch.bool:
        t = torch.randint(0, 2, shape, generator=generator).bool()
    else:
        t = torch.randint(int(spec.get("low", 0)), int(spec.get("high", 10)), shape, generator=generator).to(dtype)
    return t.to(device)


class OutputOf:
    """A value an earlier example call returned: resolved when its call runs."""

    def __init__(self, spec: Any, call: int) -> None:
        if not isinstance(spec, dict) or set(spec) - {"call", "path"} or not isinstance(spec.get("call"), int):
            raise PrecompileError(f"call {call}: \"output_of\" is {{\"call\": N, \"path\": \"a.b\"}}, not {spec!r}")
        if not 0 <= spec["call"] < call:
            raise PrecompileError(f"call {call}: \"output_of\" names call {spec['call']}, not an earlier one")
        self.call = spec["call"]
        self.path = str(spec.get("path", ""))

    def resolve(self, results: Sequence[Any]) -> Any:
        value = results[self.call]
        for word in [w for w in self.path.split(".") if w]:
            if isinstance(value, dict) and word in value:
                value = value[word]
            elif isinstance(value, (list, tuple)) and word.lstrip("-").isdigit():
                value = value[int(word)]
            elif hasattr(value, word):
                value = getattr(value, word)
            else:
                raise PrecompileError(f"output_of call {self.call}: no '{word}' in {self.path!r}")
        return value


class MadeBy:
    """A value a function of the model's code makes: made when its call runs
    (a fresh one each time, as a model may fill what it is passed)."""

    def __init__(self, spec: Any, call: int) -> None:
        if not isinstance(spec, str) or spec.count(":") != 1:
            raise PrecompileError(f"call {call}: \"made_by\" is \"pkg.module:function\", not {spec!r}")
        self.spec = spec

    def resolve(self) -> Any:
        module, _, name = self.spec.partition(":")
        try:
            function = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError) as e:
            raise PrecompileError(f"made_by {self.spec!r}: {e}") from e
        return function()


def resolved(value: Any, results: Sequence[Any]) -> Any:
    """`value` with each OutputOf replaced by what its call returned, and
    each MadeBy by what its function makes."""
    if isinstance(value, OutputOf):
        return value.resolve(results)
    if isinstance(value, MadeBy):
        return value.resolve()
    if isinstance(value, list):
        return [resolved(x, results) for x in value]
    if isinstance(value, dict):
        return {k: resolved(x, results) for k, x in value.items()}
    return value


def _refers_to_outputs(value: Any) -> bool:
    if isinstance(value, (OutputOf, MadeBy)):
        return True
    if isinstance(value, (list, tuple)):
        return any(_refers_to_outputs(x) for x in value)
    if isinstance(value, dict):
        return any(_refers_to_outputs(x) for x in value.values())
    return False


def _value(v: Any, device: str, call: int) -> Any:
    if isinstance(v, dict) and set(v) == {"tensor"}:
        return make_tensor(v["tensor"], device)
    if isinstance(v, dict) and set(v) == {"output_of"}:
        return OutputOf(v["output_of"], call)
    if isinstance(v, dict) and set(v) == {"made_by"}:
        return MadeBy(v["made_by"], call)
    if isinstance(v, list):
        return [_value(x, device, call) for x in v]
    if isinstance(v, dict):
        return {k: _value(x, device, call) for k, x in v.items()}
    return v


def load_calls(path: str, device: str = "cpu") -> List[Tuple[List[Any], Dict[str, Any]]]:
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise PrecompileError(f"cannot read the calls file {path}: {e}") from e
    if not isinstance(data, list) or not data:
        raise PrecompileError(f"{path}: expected a non-empty list of calls")
    calls = []
    for i, call in enumerate(data):
        if not isinstance(call, dict) or not set(call) <= {"args", "kwargs"}:
            raise PrecompileError(f"{path}: call {i} must be an object with \"args\" and \"kwargs\"")
        args = call.get("args", [])
        kwargs = call.get("kwargs", {})
        if not isinstance(args, list) or not isinstance(kwargs, dict):
            raise PrecompileError(f"{path}: call {i}: \"args\" is a list and \"kwargs\" an object")
        calls.append(([_value(a, device, i) for a in args], {k: _value(v, device, i) for k, v in kwargs.items()}))
    return calls


def parse_max_sizes(texts: Sequence[str]) -> Dict[str, Dict[Optional[int], int]]:
    """--max-size NAME=N (every dimension of NAME) and NAME.DIM=N."""
    limits: Dict[str, Dict[Optional[int], int]] = {}
    for text in texts:
        target, _, size = text.partition("=")
        name, dot, dim = target.partition(".")
        try:
            key = int(dim) if dot else None
            largest = int(size)
        except ValueError:
            key = largest = -1
        if not name or (key is not None and key < 0) or largest < 1:
            raise PrecompileError(
                f"--max-size {text!r}: expected NAME=N or NAME.DIM=N with N at least 1, e.g. "
                "pixel_values.2=1024")
        if key in limits.setdefault(name, {}):
            raise PrecompileError(f"--max-size gives {target} twice")
        limits[name][key] = largest
    return limits


def _capture(args: argparse.Namespace) -> int:
    try:
        max_sizes = parse_max_sizes(args.max_size)  # Before the model is built.
        module, factory = import_object(args.model)
        model = factory if isinstance(factory, torch.nn.Module) else factory()
        device = args.device or "cpu"
        if isinstance(model, torch.nn.Module):
            model = model.to(device)
        frames = resolve_frames([f for f in (args.frames or "").split(",") if f], model, module)
        calls = load_calls(args.calls, device)
        cap = capture(
            model,
            name=args.name,
            device=device,
            frames=frames,
            recompile_limit=args.recompile_limit,
            eager=args.eager,
            dynamic=False if args.static_shapes else None,
            suppress_errors=args.suppress_errors,
            max_sizes=max_sizes,
        )
        results: List[Any] = []
        for call_args, call_kwargs in calls:
            results.append(cap(*resolved(call_args, results), **resolved(call_kwargs, results)))
        summary = cap.summary()
        out = cap.save(args.out, require_complete=not args.allow_incomplete)
    except PrecompileError as e:
        print(f"precompile_capture: error: {e}", file=sys.stderr)
        return 2
    total = sum(s for _, _, s in cap.compile_log)
    print(f"precompile_capture: wrote {out}")
    print(f"  frames: {', '.join(summary.frames)}")
    print(f"  variants: {summary.variants_per_frame}")
    print(f"  eager fallbacks: {list(summary.eager_fallbacks)}")
    print(f"  uncovered: {list(summary.uncovered_frames)}; truncated: {summary.truncated}; complete: {summary.complete}")
    print(f"  {len(cap.compile_log)} AOTInductor compiles, {total:.1f} s")
    for name, module in cap.operators().items():
        # The server must have each: from --op_library, or Python's.
        print(f"  calls {name}, " + (f"defined in Python by {module} (serve with --allow_python_programs)"
                                    if module else "from a library to load with --op_library"))
    # What a request may send: the entry's variants' guards, the bounds a
    # model's code put on its sizes among them (a request outside is refused).
    entry = cap.frame(cap.entry.name)
    for variant_id, words in entry.variants:
        print(f"  {variant_id}: {words if len(words) <= 400 else words[:400] + '...'}")
    cap.close()
    return 0


def _recapture(args: argparse.Namespace) -> int:
    from .recapturing import newest_version, parse_int_range, read_manifest, recapture  # noqa: PLC0415

    try:
        int_ranges: Dict[str, Tuple[int, int]] = {}
        for text in args.int_range:
            param, bounds = parse_int_range(text)
            if param in int_ranges:
                raise PrecompileError(f"--int-range gives '{param}' twice")
            int_ranges[param] = bounds
        module, factory = import_object(args.model)
        model = factory if isinstance(factory, torch.nn.Module) else factory()
        frames = None
        if args.frames is not None:
            frames = resolve_frames([f for f in args.frames.split(",") if f], model, module)
        calls: List[Tuple[List[Any], Dict[str, Any]]] = []
        if args.calls:
            # Made on the previous version's device, which the recapture keeps.
            device = args.device or read_manifest(newest_version(os.path.abspath(args.recapture))[1]).device
            calls = load_calls(args.calls, device)
            if any(_refers_to_outputs(call) for call in calls):
                raise PrecompileError(
                    f"{args.calls}: \"output_of\" and \"made_by\" are for a capture's calls; a recapture replays "
                    "calls in its own order (a structure an earlier call returned is made up "
                    "from its recorded shapes instead)"
                )
        report = recapture(
            model,
            args.recapture,
            args.misses,
            name=args.name,
            device=args.device,
            frames=frames,
            model_module=module,
            calls=calls,
            int_ranges=int_ranges,
            recompile_limit=args.recompile_limit,
            allow_incomplete=args.allow_incomplete,
            eager=args.eager,
        )
    except PrecompileError as e:
        print(f"precompile_capture: error: {e}", file=sys.stderr)
        return 2
    print(report.format())
    return 0


class _Progress(logging.Handler):
    """Prints what the capture is compiling to standard error as it starts
    and ends (a dynamic variant of a large model can take many minutes)."""

    def emit(self, record: logging.LogRecord) -> None:
        print(f"precompile_capture: {record.getMessage()}", file=sys.stderr, flush=True)


def _print_progress() -> None:
    progress = logging.getLogger("precompile_capture.progress")
    progress.setLevel(logging.INFO)
    progress.propagate = False
    if not any(isinstance(h, _Progress) for h in progress.handlers):
        progress.addHandler(_Progress())


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m precompile_capture", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="pkg.module:factory")
    parser.add_argument("--calls", help="JSON list of example calls (with --recapture: extra calls)")
    parser.add_argument("--name", help="the model's name in the artifact")
    parser.add_argument("--out", help="the artifact directory to write")
    parser.add_argument("--device", choices=["cpu", "cuda"], help="default cpu; with --recapture, the previous version's")
    parser.add_argument("--frames", help="comma-separated sub-frames")
    parser.add_argument("--recompile-limit", type=int, default=8)
    parser.add_argument(
        "--eager",
        choices=("auto", "torchscript", "python"),
        default="auto",
        help="eager programs of flagged frames: TorchScript, the frame's own Python, or TorchScript "
        "when the frame scripts, else Python (default)",
    )
    parser.add_argument("--static-shapes", action="store_true",
                        help="never a dynamic dimension: each new shape compiles a static variant "
                        "(torch.compile's dynamic=False); default: Dynamo's automatic dynamic shapes")
    parser.add_argument("--max-size", action="append", default=[], metavar="NAME[.DIM]=N",
                        help="the largest size of dimension DIM (without .DIM: of every dimension) of "
                        "the entry's tensor parameter NAME that the variants take: the server refuses "
                        "a larger call (runs it eagerly where the frame is flagged) instead of running "
                        "compiled code at whatever size a client sends; kept by recaptures")
    parser.add_argument("--suppress-errors", action="store_true",
                        help="a call whose compile fails (an Inductor error) runs eagerly and leaves "
                        "its frame uncovered, instead of ending the capture; with --allow-incomplete")
    parser.add_argument("--allow-incomplete", action="store_true", help="save even if not complete")
    parser.add_argument("--recapture", metavar="REPOSITORY/MODEL",
                        help="write the next version of this served model from --misses")
    parser.add_argument("--misses", metavar="MISSES.json", help="the server's MissesResponse JSON")
    parser.add_argument("--int-range", action="append", default=[], metavar="NAME=LO:HI",
                        help="values [LO, HI) of integer tensors made up for entry parameter NAME")
    args = parser.parse_args(argv)
    _print_progress()
    if args.recapture is None:
        missing = [flag for flag, value in (("--calls", args.calls), ("--name", args.name), ("--out", args.out))
                   if not value]
        if missing:
            parser.error(f"the following arguments are required: {', '.join(missing)} "
                         "(or --recapture REPOSITORY/MODEL --misses FILE)")
        if args.misses or args.int_range:
            parser.error("--misses and --int-range go with --recapture")
        return _capture(args)
    if not args.misses:
        parser.error("--recapture needs --misses (the server's MissesResponse JSON)")
    if args.out:
        parser.error("--recapture writes REPOSITORY/MODEL/<N+1>; --out does not apply")
    if args.max_size:
        parser.error("--max-size applies to a first capture: a recapture keeps the previous version's")
    if args.static_shapes:
        parser.error("--static-shapes applies to a first capture: a recapture compiles what the "
                     "misses need, as Dynamo would")
    return _recapture(args)
