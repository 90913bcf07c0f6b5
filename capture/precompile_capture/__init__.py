"""precompile_capture: capture a PyTorch program into a precompile artifact.

    cap = precompile_capture.capture(model, name="mlp", frames=["encoder"])
    cap(x)            # runs the program, recording what Dynamo does
    cap.summary()     # PrecompileSummary
    cap.save("out/")  # the artifact directory, or PrecompileError

    # The next version of a served model, covering the calls its server missed:
    precompile_capture.recapture(model, "repo/mlp", "misses.json")

See capture.Capture (what capture() makes) for the arguments, and
docs/architecture.md ("Concepts") for the semantics of eager fallbacks, coverage and the summary.
"""

import warnings as _warnings

__version__ = "0.1.0"

# TorchScript (the eager programs) warns that it is deprecated on every use.
_warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"torch\.jit")

from .capture import Capture, capture  # noqa: E402
from .errors import PrecompileError  # noqa: E402
from .frames import FrameInfo, Kind  # noqa: E402
from .ops import register_frame  # noqa: E402
from .summary import FallbackCause, PrecompileSummary  # noqa: E402

__all__ = [
    "Capture",
    "FallbackCause",
    "FrameInfo",
    "Kind",
    "PrecompileError",
    "MissResult",
    "PrecompileSummary",
    "RecaptureReport",
    "capture",
    "recapture",
    "register_frame",
]


def __getattr__(name: str):
    # recapture reads protos (artifact and admin); like save(), it loads them
    # only when used, so importing the package for capture() does not.
    if name in ("MissResult", "RecaptureReport", "recapture"):
        from . import recapturing  # noqa: PLC0415

        return getattr(recapturing, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
