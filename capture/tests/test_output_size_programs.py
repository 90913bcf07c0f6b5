"""Outputs whose sizes are expressions of the inputs' sizes (a
concatenation's sum, a reshape's product, a strided convolution's floor
division) are recorded as size programs, so that the server can tell an
output's size before the model runs. Each program is checked by running it
for sizes other than the captured one and comparing with what the model
really returns.

Exports only (no AOTInductor compile): fast.
"""

import torch
from torch.export import Dim

from precompile_capture.guards import extract_guards, output_specs, size_program


def run_program(steps, symbols):
    """What the server computes (runtime/size_program.h), in Python."""
    ops = {"ADD": lambda a, b: a + b, "MUL": lambda a, b: a * b,
           "FLOOR_DIV": lambda a, b: a // b, "MOD": lambda a, b: a % b,
           "MAX": max, "MIN": min}
    stack = []
    for kind, value in steps:
        if kind == "constant":
            stack.append(value)
        elif kind == "symbol":
            stack.append(symbols[value])
        else:
            b, a = stack.pop(), stack.pop()
            stack.append(ops[value](a, b))
    assert len(stack) == 1
    return stack[0]


class Reshaped(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, kernel_size=3, stride=2)

    def forward(self, x, image):
        return torch.cat([x, x * 2]), x.reshape(-1), self.conv(image)


def capture_reshaped():
    """The exported Reshaped, its output specs, and per input dimension that
    is dynamic the guard symbol id that stands for its size."""
    x, image = torch.randn(8, 4), torch.randn(1, 3, 17, 17)
    ep = torch.export.export(Reshaped(), (x, image), strict=True,
                             dynamic_shapes=({0: Dim("batch", min=2)},
                                             {2: Dim("height", min=5), 3: Dim("width", min=5)}))
    guards, _ = extract_guards(ep, [x, image])
    ids = {name: r.symbol for r in guards.symbols for name in r.name.split("=")}
    nodes = {n.name: n for n in ep.graph.nodes}
    x_node, image_node = (nodes[name] for name in ep.graph_signature.user_inputs)
    symbol_of = {
        "batch": ids[str(x_node.meta["val"].shape[0].node.expr)],
        "height": ids[str(image_node.meta["val"].shape[2].node.expr)],
        "width": ids[str(image_node.meta["val"].shape[3].node.expr)],
    }
    return output_specs(ep, guards), symbol_of


def test_expressions_of_sizes_become_programs_that_compute_the_real_sizes():
    specs, symbol_of = capture_reshaped()
    assert len(specs) == 3
    model = Reshaped()
    for batch, height, width in [(2, 5, 9), (8, 17, 17), (1000, 64, 31)]:
        outputs = model(torch.randn(batch, 4), torch.randn(1, 3, height, width))
        values = {symbol_of["batch"]: batch, symbol_of["height"]: height,
                  symbol_of["width"]: width}
        for (dtype, shape, symbols, programs), out in zip(specs, outputs):
            for d, expected in enumerate(out.shape):
                if shape[d] >= 0:
                    assert shape[d] == expected
                elif symbols[d] >= 0:
                    assert values[symbols[d]] == expected
                else:
                    assert programs[d] is not None, (shape, symbols, d)
                    assert run_program(programs[d], values) == expected, (programs[d], d)
    # The concatenation's, the reshape's and the convolution's sizes are
    # expressions, each written as a program.
    assert specs[0][3][0] is not None
    assert specs[1][3][0] is not None
    assert specs[2][3][2] is not None and specs[2][3][3] is not None


def test_an_expression_a_program_cannot_say_has_none():
    import sympy
    s0 = sympy.Symbol("s0", integer=True, positive=True)
    assert size_program(2 * s0 + 1, {"s0": 0}) == [
        ("constant", 1), ("constant", 2), ("symbol", 0), ("op", "MUL"), ("op", "ADD")]
    assert size_program(s0 / 3, {"s0": 0}) is None  # A fraction.
    assert size_program(2 * s0, {}) is None  # A symbol the guards do not bind.
    assert size_program(sympy.sqrt(s0), {"s0": 0}) is None
