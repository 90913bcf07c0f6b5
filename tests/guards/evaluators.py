"""The guard evaluators the differential tests compare, for one guard set
and one call each: the runtime's (guard_eval, a child process running
runtime/guard_program.cc) and the capture's (GuardSet.holds).

A call is a list of values in signature order: a tensor is described as
("tensor", dtype, device, shape), everything else is itself.
"""

import os
import pathlib
import subprocess
import struct
import sys

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

ROOT = pathlib.Path(os.path.abspath(__file__)).parents[2]
sys.path.insert(0, str(ROOT / "capture"))
sys.path.insert(0, str(ROOT / "tests" / "fuzz"))

from make_seeds import encode_guard_call  # noqa: E402
from precompile_capture.artifact import guards_proto  # noqa: E402
from precompile_capture.frames import Kind  # noqa: E402
from precompile_capture.guards import DTYPE_NAMES  # noqa: E402
from proto import artifact_pb2 as pb  # noqa: E402

# Every dtype a guard can name, as the capture names them.
DTYPES = list(DTYPE_NAMES)


class GuardEval:
    """guard_eval as a child process: one record in, one line out."""

    def __init__(self):
        binary = ROOT / "tests" / "guards" / "guard_eval"
        self.process = subprocess.Popen([str(binary)], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE)

    def __call__(self, record: bytes) -> str:
        self.process.stdin.write(struct.pack("<I", len(record)) + record)
        self.process.stdin.flush()
        return self.process.stdout.readline().decode().strip()

    def close(self):
        self.process.stdin.close()
        assert self.process.wait(timeout=10) == 0


def kind_of(value):
    if isinstance(value, tuple):
        return Kind.TENSOR
    if value is None:
        return Kind.OPTIONAL_TENSOR
    return {bool: Kind.BOOL, int: Kind.INT, float: Kind.FLOAT, str: Kind.STRING}[type(value)]


def python_holds(guards, values, grad, default_dtype):
    with FakeTensorMode() as mode:
        args = [
            torch.empty(v[3], dtype=v[1], device=v[2]) if isinstance(v, tuple) else v
            for v in values
        ]
    previous = torch.get_default_dtype()
    try:
        torch.set_default_dtype(default_dtype)
        with torch.set_grad_enabled(grad), mode:
            return guards.holds(args)
    finally:
        torch.set_default_dtype(previous)


def runtime_record(params, guards, values, grad, default_dtype):
    frame = pb.Frame(name="forward")
    for i, _ in enumerate(params):
        frame.parameters.add(name=f"a{i}")
    # The kind the manifest records for each parameter: what the guard holds.
    kinds = []
    for p in params:
        if p[0] == "tensor":
            kinds.append(Kind.TENSOR)
        elif p[0] == "none":
            kinds.append(Kind.OPTIONAL_TENSOR)
        else:
            kinds.append(kind_of(p[1]))
    guards_proto(frame.variants.add(id="forward#0"), guards, kinds)
    call = []
    for v in values:
        if isinstance(v, tuple):
            call.append(("tensor", DTYPE_NAMES[v[1]], v[3], 1 if v[2] == "cuda" else 0))
        elif v is None:
            call.append(("none",))
        else:
            call.append(({bool: "bool", int: "int", float: "float", str: "string"}[type(v)], v))
    return encode_guard_call(frame.SerializeToString(), call, grad=grad,
                             default_dtype=DTYPE_NAMES[default_dtype])
