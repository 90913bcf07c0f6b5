"""Coverage of a capture, in the sense docs/architecture.md ("Concepts") gives it."""

from __future__ import annotations

import dataclasses
import enum
from typing import Dict, Tuple


class FallbackCause(enum.Enum):
    """Why Dynamo gave up on a frame (mirrors artifact.proto's FallbackCause)."""

    GRAPH_BREAK = "GRAPH_BREAK"
    GENERATOR = "GENERATOR"
    USER_ERROR = "USER_ERROR"
    BACKEND_SKIP = "BACKEND_SKIP"
    SKIP_FRAME = "SKIP_FRAME"

    def describe(self) -> str:
        return _CAUSE_WORDS[self]


_CAUSE_WORDS = {
    FallbackCause.GRAPH_BREAK: "a graph break Dynamo cannot resume from",
    FallbackCause.GENERATOR: "a frame Dynamo refuses to trace (a generator)",
    FallbackCause.USER_ERROR: "a UserError Dynamo suppressed (data-dependent control flow)",
    FallbackCause.BACKEND_SKIP: "the backend declined the graph (SkipFrame)",
    FallbackCause.SKIP_FRAME: "a torch._dynamo.skip_frame() call",
}

ALL_CAUSES_IN_WORDS = (
    "a graph break Dynamo cannot resume from, a skip_frame() call, a frame Dynamo "
    "refuses to trace such as a generator, a suppressed UserError, or a backend SkipFrame"
)


@dataclasses.dataclass(frozen=True)
class PrecompileSummary:
    """What a capture covers.

    frames: every frame, the entry first.
    variants_per_frame: compiled variants of each frame.
    eager_fallbacks: frames Dynamo gave up on (flagged `eager_fallback`); a call
        their variants miss is served eagerly. A variant-less entry fallback is
        not among them.
    uncovered_frames: frames with no variant that are not eager fallbacks,
        plus a variant-less entry fallback.
    truncated: some frame hit the recompile limit.
    complete: no uncovered frame and not truncated.
    """

    frames: Tuple[str, ...]
    variants_per_frame: Dict[str, int]
    eager_fallbacks: Tuple[str, ...]
    uncovered_frames: Tuple[str, ...]
    truncated: bool
    complete: bool
