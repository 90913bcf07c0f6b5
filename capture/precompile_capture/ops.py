"""The `precompile::call_frame` operator that eager programs call.

An eager program (a frame's TorchScript) calls every other captured frame
through `precompile::call_frame(str frame, Any[] args) -> Tensor[]`, so that
the C++ runtime can dispatch the callee to its own variants. The runtime
registers the operator in C++ with the same schema. This module registers it
in Python too, because TorchScript resolves the operator when it scripts a
frame, and so that a saved eager program can run in a Python process: the
Python implementation runs the named frame's original Python code, looked up
in a registry that every capture fills with its frames.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Dict, List

import torch

SCHEMA = "(str frame, Any[] args) -> Tensor[]"
QUALIFIED_NAME = "precompile::call_frame"

_lock = threading.Lock()
_frames: Dict[str, Callable[..., Any]] = {}
_defined = False


def _call_frame_impl(frame: str, args: List[Any]) -> List[torch.Tensor]:
    with _lock:
        fn = _frames.get(frame)
    if fn is None:
        raise RuntimeError(
            f"precompile::call_frame: no frame named '{frame}' is registered in this "
            "process (precompile_capture.ops.register_frame registers one; a capture "
            "registers its frames when it is created)"
        )
    out = fn(*args)
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)) and all(isinstance(t, torch.Tensor) for t in out):
        return list(out)
    raise RuntimeError(
        f"precompile::call_frame: frame '{frame}' returned {type(out).__name__}, "
        "not a tensor or a tuple of tensors"
    )


def ensure_registered() -> None:
    """Defines the operator once per process (idempotent)."""
    global _defined
    with _lock:
        if _defined:
            return
        try:
            torch.ops.precompile.call_frame  # already defined (by C++ or earlier)
            exists = True
        except (AttributeError, RuntimeError):
            exists = False
        if not exists:
            torch.library.define(QUALIFIED_NAME, SCHEMA)
            torch.library.impl(QUALIFIED_NAME, "CompositeExplicitAutograd")(_call_frame_impl)
        _defined = True


def register_frame(name: str, fn: Callable[..., Any]) -> None:
    """Makes `call_frame(name, args)` run `fn(*args)` in this process.

    A later registration of the same name replaces the earlier one.
    """
    ensure_registered()
    with _lock:
        _frames[name] = fn


def registered_frames() -> Dict[str, Callable[..., Any]]:
    with _lock:
        return dict(_frames)
