"""Small models for the capture tests."""

from typing import Optional

import torch


@torch._dynamo.disable
def opaque(y: torch.Tensor) -> torch.Tensor:
    return y * 2.0 + 1.0


class Loop(torch.nn.Module):
    """n=0 traces no op at all (an empty graph returning its input)."""

    def forward(self, x: torch.Tensor, n: int = 0) -> torch.Tensor:
        y = x
        for _ in range(n):
            y = opaque(y)
        return y


class MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))

    def forward(self, x):
        return self.net(x)


def scale(y: torch.Tensor, factor: float = 2.0) -> torch.Tensor:
    return torch.tanh(y) * factor


def picky(y: torch.Tensor) -> torch.Tensor:
    torch._dynamo.skip_frame()
    return y - 1.0


class Encoder(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(4, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.proj(x))


class Nested(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.encoder = Encoder()
        self.head = torch.nn.Linear(6, 2)

    def forward(self, x: torch.Tensor, k: int = 0):
        y = self.encoder(x)
        for _ in range(k):
            y = opaque(y)
        y = scale(y, 2.0)
        if k > 1:
            y = picky(y)
        return self.head(y), y


class Generator(torch.nn.Module):
    def forward(self, x: torch.Tensor):
        yield x * 2.0


class SkipsFrame(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        torch._dynamo.skip_frame()
        return x + 1.0


class DataDependent(torch.nn.Module):
    """check=True: a size that depends on data (a UserError in strict export)."""

    def forward(self, x: torch.Tensor, check: bool = False) -> torch.Tensor:
        if check:
            if x.nonzero().size(0) > 2:
                return x * 2.0
        return x + 1.0


class DataDependentBranch(torch.nn.Module):
    """Branching on a tensor's value: a graph break ('Data-dependent branching')."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:
            return x * 2.0
        return x - 2.0


class Plain(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 3.0 + 1.0


class Kinds(torch.nn.Module):
    def forward(self, x, mask: Optional[torch.Tensor] = None, n=3, alpha: float = 0.5, flag=False, mode: str = "a"):
        return x


class UsesLambda(torch.nn.Module):
    """TorchScript cannot compile its lambda; n > 0 breaks the graph in a loop."""

    def forward(self, x: torch.Tensor, n: int = 0) -> torch.Tensor:
        f = lambda t: t + 1.0  # noqa: E731
        for _ in range(n):
            x = opaque(x)
        return f(x)


class UnannotatedInt(torch.nn.Module):
    """`n` has no annotation and no default: TorchScript takes it for a Tensor.
    It breaks the graph in a loop."""

    def forward(self, x: torch.Tensor, n) -> torch.Tensor:
        for _ in range(2):
            x = opaque(x)
        return x * n


class Calls(torch.nn.Module):
    """An entry that calls `inner(x, *args)`, for capturing `inner` as a frame."""

    def __init__(self, inner: torch.nn.Module, *args) -> None:
        super().__init__()
        self.inner = inner
        self.args = args

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x, *self.args)
