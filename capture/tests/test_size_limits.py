"""--max-size: the largest sizes a model's variants take.

A dynamic size is otherwise unbounded: compiled code runs at whatever size a
client sends, and cannot be stopped once it runs. The limits bound the
symbols of the entry's variants (the server refuses a larger call before
any code runs: tests/hostile, bounded_images), are recorded in the
manifest, and a recapture keeps them.

Two AOTInductor compiles.
"""

import os

import pytest
import torch

import precompile_capture
import proto.artifact_pb2 as pb
from conftest import frame_proto, read_manifest
from models_for_tests import MLP
from precompile_capture.cli import parse_max_sizes
from precompile_capture.recapturing import _past_size_limit, size_limits


@pytest.fixture(scope="module")
def bounded(tmp_path_factory):
    cap = precompile_capture.capture(MLP().eval(), name="mlp", max_sizes={"x": {0: 64}})
    cap(torch.randn(8, 4))
    cap(torch.randn(16, 4))  # the batch becomes dynamic, up to 64
    yield cap, cap.save(tmp_path_factory.mktemp("bounded") / "mlp")
    cap.close()


def test_a_limited_dimension_s_symbol_ends_at_the_limit(bounded):
    cap, directory = bounded
    assert cap.frame("forward").variants[1] == ("forward#1", "x: float32[s0 in [2, 64], 4]")
    entry = frame_proto(read_manifest(directory), "forward")
    assert [(s.min, s.max) for s in entry.variants[1].symbols] == [(2, 64)]
    assert size_limits(entry) == {"x": {0: 64}}
    with open(os.path.join(directory, "FRAMES")) as frames:
        assert "  x: dimension 0 at most 64 (--max-size)" in frames.read().splitlines()


def test_a_call_within_the_limit_is_served_by_the_bounded_variant(bounded):
    cap = bounded[0]
    compiles = len(cap.compile_log)
    x = torch.randn(64, 4)
    assert torch.equal(cap(x), MLP().eval()(x))
    assert len(cap.compile_log) == compiles


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
    cap = precompile_capture.capture(MLP().eval(), name="mlp", max_sizes={"x": {2: 10}})
    try:
        with pytest.raises(precompile_capture.PrecompileError,
                           match=r"--max-size x.2=10 names dimension 2 of 'x', which has 2"):
            cap(torch.randn(8, 4))
        assert cap.compile_log == []
    finally:
        cap.close()


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
