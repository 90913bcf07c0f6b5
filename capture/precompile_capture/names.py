"""Objects from the names a command line or a manifest gives them: the
model's factory (`module:attribute`) and its frames (sub-module paths and
function names). Shared by the command line and recapturing."""

from __future__ import annotations

import importlib
from typing import Any, List, Sequence, Tuple

import torch

from .errors import PrecompileError


def import_object(target: str) -> Tuple[Any, Any]:
    """The module and the object that `module:attribute` names."""
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


def resolve_frames(specs: Sequence[str], model: Any, model_module: Any) -> List[Any]:
    """The frames `capture(frames=...)` takes, from their names: a sub-module
    path of `model`, a function of `model_module`, or `module:function`."""
    frames: List[Any] = []
    for spec in specs:
        if ":" in spec:
            frames.append(import_object(spec)[1])
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
