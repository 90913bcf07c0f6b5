"""--max-size: the largest sizes a model's variants take.

A dynamic size is otherwise unbounded: compiled code runs at whatever size a
client sends, and cannot be stopped once it runs. The limits bound the
symbols of the entry's variants (the server refuses a larger call before
any code runs, naming the limit: tests/hostile, bounded_images, whose
capture writes them into its manifest), and a recapture keeps them.

Exports only (no AOTInductor compile): fast.
"""

import pytest
import torch
from torch.export import Dim

import precompile_capture
import proto.artifact_pb2 as pb
from models_for_tests import MLP
from precompile_capture.cli import parse_max_sizes
from precompile_capture.compiling import limited_sizes
from precompile_capture.frames import Frame
from precompile_capture.guards import extract_guards
from precompile_capture.recapturing import _past_size_limit


class Masked(torch.nn.Module):
    def forward(self, x, mask):
        return x * mask


def guards_of(limits, x, mask):
    """The guards of Masked exported with dynamic sizes, limited by `limits`."""
    ep = torch.export.export(Masked(), (x, mask), dynamic_shapes=({0: Dim.AUTO, 1: Dim.AUTO},) * 2)
    frame = Frame("forward", is_entry=True, module=Masked())
    frame.size_limits = limits
    guards, _ = extract_guards(ep, [x, mask], ["x", "mask"])
    return limited_sizes(guards, frame, [x, mask], "call 0: forward(x, mask)")


def ranges(guards):
    return [(s.min, s.max) for s in sorted(guards.symbols, key=lambda s: s.symbol)]


def test_a_limited_dimension_s_symbol_ends_at_the_limit():
    x = torch.randn(4, 6)
    assert ranges(guards_of({}, x, x)) == [(2, None), (2, None)]
    assert ranges(guards_of({"x": {1: 64}}, x, x)) == [(2, None), (2, 64)]
    # One symbol for both tensors' sizes: the tighter limit holds for it.
    assert ranges(guards_of({"x": {None: 100}, "mask": {0: 8}}, x, x)) == [(2, 8), (2, 100)]


def test_an_example_call_past_a_limit_is_an_error_before_any_compile():
    cap = precompile_capture.capture(MLP().eval(), name="mlp", max_sizes={"x": {None: 10}})
    try:
        with pytest.raises(precompile_capture.PrecompileError,
                           match=r"'x' has 12 in dimension 0, more than the 10 that --max-size x=10 allows"):
            cap(torch.randn(12, 4))
        assert cap.compile_log == []
    finally:
        cap.close()


def test_a_limit_must_name_a_dimension_the_tensor_has():
    with pytest.raises(precompile_capture.PrecompileError,
                       match=r"--max-size x.2=10 names dimension 2 of 'x', which has 2"):
        guards_of({"x": {2: 10}}, torch.randn(4, 6), torch.randn(4, 6))


def test_a_limit_must_name_a_parameter_of_the_entry():
    with pytest.raises(precompile_capture.PrecompileError, match="'pixels', which is not a parameter"):
        precompile_capture.capture(MLP().eval(), name="mlp", max_sizes={"pixels": {0: 8}})


@pytest.mark.parametrize("text", ["x", "x=0", "x=big", "x.-1=4", "x.d=4", "=4"])
def test_the_command_line_refuses_a_limit_it_cannot_read(text):
    with pytest.raises(precompile_capture.PrecompileError, match="expected NAME=N or NAME.DIM=N"):
        parse_max_sizes([text])


def test_the_command_line_reads_every_dimension_or_one():
    assert parse_max_sizes(["x=512", "x.0=8", "mask.1=128"]) == {"x": {None: 512, 0: 8}, "mask": {1: 128}}


def test_a_recapture_does_not_replay_a_miss_past_a_limit():
    def call(shape):
        c = pb.CallSignature()
        c.arguments.add(name="x").tensor.shape.extend(shape)
        return c

    limits = {"x": {None: 512, 0: 8}}
    assert _past_size_limit(call([8, 512]), limits) is None
    assert _past_size_limit(call([9, 4]), limits) == "its 'x' has 9 in dimension 0, more than 8"
    assert _past_size_limit(call([2, 513]), limits) == "its 'x' has 513 in dimension 1, more than 512"
