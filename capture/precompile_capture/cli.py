"""Command line: capture a model on example calls and write its artifact.

    python -m precompile_capture --model pkg.module:factory --calls calls.json \\
        --name NAME --out DIR [--device cpu] [--frames a,b] [--allow-incomplete]

`factory` is called with no arguments and returns the model (an nn.Module or a
function); an nn.Module instance named directly is used as is. calls.json is a
list of {"args": [...], "kwargs": {...}}; a tensor is written
{"tensor": {"shape": [8, 4], "dtype": "float32", "seed": 0}} (deterministic
random values: normal for floating dtypes, integers in [low, high) -- default
[0, 10) -- for integer dtypes, 0/1 for bool) or
{"tensor": {"values": [[1, 2], [3, 4]], "dtype": "float32"}}; any other JSON
value is passed as the Python value (numbers, strings, booleans, null).
A frame in --frames is a sub-module path, a function of the model's module
named by its name, or "pkg.module:function".
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from .capture import capture
from .errors import PrecompileError

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


def _value(v: Any, device: str) -> Any:
    if isinstance(v, dict) and set(v) == {"tensor"}:
        return make_tensor(v["tensor"], device)
    if isinstance(v, list):
        return [_value(x, device) for x in v]
    if isinstance(v, dict):
        return {k: _value(x, device) for k, x in v.items()}
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
        calls.append(([_value(a, device) for a in args], {k: _value(v, device) for k, v in kwargs.items()}))
    return calls


def _import(target: str) -> Tuple[Any, Any]:
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise PrecompileError(f"expected module:attribute, not {target!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise PrecompileError(f"cannot import {module_name}: {e}") from e
    try:
        return module, getattr(module, attr)
    except AttributeError:
        raise PrecompileError(f"module {module_name} has no attribute {attr!r}") from None


def _resolve_frames(specs: Sequence[str], model: Any, model_module: Any) -> List[Any]:
    frames: List[Any] = []
    for spec in specs:
        if ":" in spec:
            frames.append(_import(spec)[1])
            continue
        if isinstance(model, torch.nn.Module):
            try:
                model.get_submodule(spec)
                frames.append(spec)
                continue
            except AttributeError:
                pass
        fn = getattr(model_module, spec, None)
        if callable(fn):
            frames.append(fn)
            continue
        raise PrecompileError(
            f"frame {spec!r} is neither a sub-module of the model nor a function of "
            f"{model_module.__name__}"
        )
    return frames


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m precompile_capture", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="pkg.module:factory")
    parser.add_argument("--calls", required=True, help="JSON list of example calls")
    parser.add_argument("--name", required=True, help="the model's name in the artifact")
    parser.add_argument("--out", required=True, help="the artifact directory to write")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--frames", default="", help="comma-separated sub-frames")
    parser.add_argument("--recompile-limit", type=int, default=8)
    parser.add_argument("--allow-incomplete", action="store_true", help="save even if not complete")
    args = parser.parse_args(argv)
    try:
        module, factory = _import(args.model)
        model = factory if isinstance(factory, torch.nn.Module) else factory()
        if isinstance(model, torch.nn.Module):
            model = model.to(args.device)
        frames = _resolve_frames([f for f in args.frames.split(",") if f], model, module)
        calls = load_calls(args.calls, args.device)
        cap = capture(
            model,
            name=args.name,
            device=args.device,
            frames=frames,
            recompile_limit=args.recompile_limit,
        )
        for i, (call_args, call_kwargs) in enumerate(calls):
            cap(*call_args, **call_kwargs)
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
    cap.close()
    return 0
