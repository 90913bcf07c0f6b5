"""A user's script that captures its own models, as people write one: the
classes and functions live in the script itself (run as `__main__`), one
class is defined inside a function, and nothing here is importable by the
server. tests/python_eager serves what it saves.

    python user_script.py OUT      # writes OUT/script and OUT/local

(bazel build //tests/python_eager:user_script runs it so.)

`script`: Model's forward is flagged (a helper Dynamo is told not to trace,
called in a loop; the helper logs a warning at each step, which TorchScript
cannot script), and calls `scale`, captured as a function frame of its own.
`local`: a class defined inside `make_local`, flagged the same way.
"""

import logging
import sys

import torch

import precompile_capture

log = logging.getLogger(__name__)


@torch.compiler.disable
def note(h: torch.Tensor) -> torch.Tensor:
    log.warning("step on %s", tuple(h.shape))
    return h


def scale(y: torch.Tensor, factor: float = 2.0) -> torch.Tensor:
    return torch.tanh(y) * factor


class Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, steps: int = 0) -> torch.Tensor:
        h = self.lin(x)
        for _ in range(steps):
            h = note(h) + 0.5
        return scale(h, 3.0)


def make_model() -> Model:
    torch.manual_seed(0)
    return Model().eval()


def make_local() -> torch.nn.Module:
    class Local(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.randn(4))

        def forward(self, x: torch.Tensor, steps: int = 0) -> torch.Tensor:
            for _ in range(steps):
                x = note(x) * self.weight
            return x + 1.0

    torch.manual_seed(1)
    return Local().eval()


def main(out: str) -> None:
    x = torch.randn(8, 4)
    model = precompile_capture.capture(make_model(), name="script", frames=[scale])
    model(x, steps=0)
    model(x, steps=1)
    model.save(f"{out}/script")
    local = precompile_capture.capture(make_local(), name="local")
    local(x, steps=0)
    local(x, steps=1)
    local.save(f"{out}/local")


if __name__ == "__main__":
    main(sys.argv[1])
