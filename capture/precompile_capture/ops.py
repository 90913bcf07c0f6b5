"""The operators that eager programs call: `precompile::call_frame` and
`precompile::check_cancelled`.

An eager program (a frame's TorchScript) calls every other captured frame
through `precompile::call_frame(str frame, Any[] args) -> Tensor[]`, so that
the C++ runtime can dispatch the callee to its own variants. The runtime
registers the operator in C++ with the same schema. This module registers it
in Python too, because TorchScript resolves the operator when it scripts a
frame, and so that a saved eager program can run in a Python process: the
Python implementation runs the named frame's original Python code, looked up
in a registry that every capture fills with its frames.

`precompile::check_cancelled() -> ()` starts every loop body of a TorchScript
eager program (eager.py puts it there): the runtime's implementation ends a
call whose client cancelled it or whose deadline passed, so that a loop whose
trip count is a request parameter cannot run for ever.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Dict, List

import torch

SCHEMA = "(str frame, Any[] args) -> Tensor[]"
QUALIFIED_NAME = "precompile::call_frame"
# Put at the start of every loop body of a TorchScript eager program: in the
# server it ends a call that was cancelled or ran past its deadline.
CHECK_CANCELLED = "precompile::check_cancelled"
CHECK_CANCELLED_SCHEMA = "check_cancelled() -> ()"

_lock = threading.Lock()
_frames: Dict[str, Callable[..., Any]] = {}
_defined = False
_library: "torch.library.Library" = None  # type: ignore[assignment]


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
    """Defines the operators once per process (idempotent)."""
    global _defined, _library
    with _lock:
        if _defined:
            return
        try:
            torch.ops.precompile.call_frame  # already defined (by C++ or earlier)
            exists = True
        except (AttributeError, RuntimeError):
            exists = False
        if not exists:
            _library = torch.library.Library("precompile", "FRAGMENT")
            torch.library.define(QUALIFIED_NAME, SCHEMA)
            torch.library.impl(QUALIFIED_NAME, "CompositeExplicitAutograd")(_call_frame_impl)
            # A Python process has no request to end: here it does nothing.
            # CONSERVATIVE, as the runtime registers it, so that TorchScript
            # keeps an operator without outputs.
            _library.define(CHECK_CANCELLED_SCHEMA, alias_analysis="CONSERVATIVE")
            _library.impl("check_cancelled", lambda: None, "CompositeExplicitAutograd")
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
