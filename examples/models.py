"""Small, deterministic example models, captured at build time (BUILD.bazel).

Each factory seeds torch before creating parameters, so the weights of a
model are the same in every process. Each model shows one behaviour of the
precompile workflow (docs/architecture.md, "Concepts"):

- mlp:    a plain MLP; a batch-8 call then a batch-16 call give a static
          variant and a dynamic-batch variant (automatic dynamic).
- loop:   a disabled helper called in a loop: n=0 compiles, n=1 is a graph
          break Dynamo cannot resume from, so `forward` is flagged eager
          fallback (GRAPH_BREAK) and keeps its n=0 variant.
- branch: data-dependent control flow when `check` is True: a UserError in
          strict export, so `forward` is flagged (USER_ERROR) and keeps its
          check=False variant.
- nested: `forward` compiles on its first call (k=0), falls back on a later
          one (k=1), and during that eager run its callees, the sub-module
          `encoder` and the function `scale`, are captured on their own with
          static shapes; its callee `wobble` is a graph break on its first
          call, so it is flagged with no variant and always runs eagerly.
- dtypes: one input of each dtype the artifact format names (float16,
          bfloat16, float32, float64, uint8, int8, int16, int32, int64,
          bool), each output keeping its input's dtype.
- passthrough: returns its input, a view of it and a new tensor: outputs
          that share the request's memory, large enough (16 KiB) for the
          server to send them by reference, so it must copy them first.
- blocks: a stack of captured blocks whose entry takes **kwargs and logs
          (Python TorchScript cannot script): steps=0 compiles, steps=1 is a
          graph break in the loop, so `forward` is flagged and its eager
          program is Python; the blocks are frames with their own variants.
          Negative steps raise, and steps beyond the blocks return a pair.
"""

import logging

import torch

logger = logging.getLogger(__name__)


@torch._dynamo.disable
def opaque(y: torch.Tensor) -> torch.Tensor:
    """A helper Dynamo must not trace: a graph break wherever it is called."""
    return y * 0.5 + 1.0


class MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def make_mlp() -> MLP:
    torch.manual_seed(0)
    return MLP().eval()


class Loop(torch.nn.Module):
    def forward(self, x: torch.Tensor, n: int = 0) -> torch.Tensor:
        y = x
        for _ in range(n):
            y = opaque(y)
        return y.sin()


def make_loop() -> Loop:
    torch.manual_seed(0)
    return Loop().eval()


class Branch(torch.nn.Module):
    def forward(self, x: torch.Tensor, check: bool = False) -> torch.Tensor:
        if check:
            # Data-dependent control flow: strict export cannot guard on it.
            if x.nonzero().size(0) > 2:
                return x * 2.0
        return x + 1.0


def make_branch() -> Branch:
    torch.manual_seed(0)
    return Branch().eval()


def scale(y: torch.Tensor, factor: float = 2.0) -> torch.Tensor:
    return torch.tanh(y) * factor


def wobble(y: torch.Tensor) -> torch.Tensor:
    # A graph break on its first call: flagged, with nothing compiled to lose.
    return opaque(y) - 0.25


class Encoder(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(4, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.proj(x))


class Nested(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = Encoder()
        self.head = torch.nn.Linear(6, 2)

    def forward(self, x: torch.Tensor, k: int = 0) -> torch.Tensor:
        y = self.encoder(x)
        for _ in range(k):
            y = wobble(y)
        return self.head(scale(y, 2.0))


def make_nested() -> Nested:
    torch.manual_seed(0)
    return Nested().eval()


class Dtypes(torch.nn.Module):
    def forward(self, f16, bf16, f32, f64, u8, i8, i16, i32, i64, b):
        return (f16 * 2.0 + 1.0, bf16 * 2.0 + 1.0, f32 * 2.0 + 1.0, f64 * 2.0 + 1.0, u8 + 3, i8 - 3,
                i16 * 3, i32 * 3, i64 * 3, b.logical_not())


def make_dtypes() -> Dtypes:
    return Dtypes().eval()


class Passthrough(torch.nn.Module):
    def forward(self, x: torch.Tensor):
        return x, x[: x.size(0) // 2], x * 2.0


def make_passthrough() -> Passthrough:
    return Passthrough().eval()


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.linear(x))


class Blocks(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList([Block(), Block()])

    def forward(self, x: torch.Tensor, steps: int = 0, **kwargs) -> torch.Tensor:
        # Two ways for the eager program to fail at serve time, for the tests:
        # an exception, and a result of another structure than the captured.
        if steps < 0:
            raise ValueError(f"steps must be at least 0, not {steps}")
        if steps > len(self.blocks):
            return x, x
        h = x
        for i, block in enumerate(self.blocks):
            h = block(h)
            if i < steps:
                h = opaque(h)
        logger.debug(f"ran {len(self.blocks)} blocks with {steps} opaque steps ({sorted(kwargs)})")
        return h


def make_blocks() -> Blocks:
    torch.manual_seed(0)
    return Blocks().eval()
