"""Reference calls of the bundled example models, for the C++ tests.

Runs each example model eagerly in Python on fixed inputs and saves inputs
and outputs in a TorchScript module (one attribute per tensor) that C++ loads
with torch::jit::load. This is how the C++ tests know what a served call must
return without Python: the same inputs through the real model.

Usage: make_reference.py OUT.pt
"""

import sys
from typing import Dict, List

import torch

from examples import models


def _input(shape, seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        return torch.randn(*shape, generator=generator).to(dtype)
    if dtype is torch.bool:
        return torch.randint(0, 2, shape, generator=generator).bool()
    low = 0 if dtype is torch.uint8 else -100
    return torch.randint(low, 100, shape, generator=generator).to(dtype)


DTYPE_INPUTS = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32,
                "f64": torch.float64, "u8": torch.uint8, "i8": torch.int8, "i16": torch.int16,
                "i32": torch.int32, "i64": torch.int64, "b": torch.bool}


# model -> case -> (factory, tensor args, scalar args)
CASES = {
    "mlp": (models.make_mlp, {
        "batch8": ({"x": _input((8, 4), 10)}, {}),
        "batch16": ({"x": _input((16, 4), 11)}, {}),
        "batch5": ({"x": _input((5, 4), 12)}, {}),
        "batch1": ({"x": _input((1, 4), 13)}, {}),
    }),
    "loop": (models.make_loop, {
        "n0": ({"x": _input((8, 4), 20)}, {"n": 0}),
        "n1": ({"x": _input((8, 4), 21)}, {"n": 1}),
        "n3": ({"x": _input((8, 4), 22)}, {"n": 3}),
        "wide_n0": ({"x": _input((16, 4), 23)}, {"n": 0}),
    }),
    "branch": (models.make_branch, {
        "unchecked": ({"x": _input((8, 4), 30)}, {"check": False}),
        "checked": ({"x": _input((8, 4), 31)}, {"check": True}),
    }),
    "nested": (models.make_nested, {
        "k0": ({"x": _input((8, 4), 40)}, {"k": 0}),
        "k1": ({"x": _input((8, 4), 41)}, {"k": 1}),
        "k2": ({"x": _input((8, 4), 42)}, {"k": 2}),
        "wide_k1": ({"x": _input((16, 4), 43)}, {"k": 1}),
    }),
    "dtypes": (models.make_dtypes, {
        "each": ({name: _input((2, 3), 60 + i, dtype) for i, (name, dtype) in enumerate(DTYPE_INPUTS.items())},
                 {}),
    }),
    "passthrough": (models.make_passthrough, {
        "rows1024": ({"x": _input((1024, 4), 50)}, {}),
    }),
    "blocks": (models.make_blocks, {
        "steps0": ({"x": _input((8, 4), 70)}, {"steps": 0}),
        "steps1": ({"x": _input((8, 4), 71)}, {"steps": 1}),
        "steps2": ({"x": _input((8, 4), 72)}, {"steps": 2}),
    }),
}


class Reference(torch.nn.Module):
    def __init__(self, tensors: Dict[str, torch.Tensor]) -> None:
        super().__init__()
        for name, tensor in tensors.items():
            self.register_buffer(name, tensor)

    def forward(self) -> int:
        return 0


def main(out: str) -> None:
    tensors: Dict[str, torch.Tensor] = {}
    for model_name, (factory, cases) in CASES.items():
        model = factory()
        for case, (tensor_args, scalar_args) in cases.items():
            prefix = f"{model_name}__{case}"
            with torch.no_grad():
                result = model(**tensor_args, **scalar_args)
            outputs: List[torch.Tensor] = list(result) if isinstance(result, tuple) else [result]
            for name, value in tensor_args.items():
                tensors[f"{prefix}__in__{name}"] = value.contiguous()
            for i, value in enumerate(outputs):
                tensors[f"{prefix}__out__{i}"] = value.contiguous()
            for name, value in scalar_args.items():
                tensors[f"{prefix}__arg__{name}"] = torch.tensor(value)
    torch.jit.save(torch.jit.script(Reference(tensors)), out)


if __name__ == "__main__":
    main(sys.argv[1])
