"""A model whose compiled code calls a custom operator, precompile_test::gate.

The capture needs the operator's schema and shapes (defined here, in Python);
the server runs the C++ implementation in gate_op.cc, loaded with
--op_library. Both must agree on the name and the schema.
"""

import torch


@torch.library.custom_op("precompile_test::gate", mutates_args=())
def gate(x: torch.Tensor) -> torch.Tensor:
    # Served from here (no --op_library), a NaN makes the operator raise:
    # what a client of a model whose Python operator fails is told.
    if torch.isnan(x).any():
        raise ValueError("precompile_test::gate refuses NaN")
    return x.clone()


@gate.register_fake
def _(x):
    return torch.empty_like(x)


class Gated(torch.nn.Module):
    def forward(self, x):
        return gate(x * 2.0) + 1.0


def make_gated():
    return Gated()
