"""Python eager programs: what the capture saves for a flagged frame
TorchScript cannot script, and what it refuses."""

import importlib.metadata
import os
import platform

import pytest
import torch

import precompile_capture
import precompile_eager
from conftest import read_manifest
from examples.models import make_blocks, make_loop, make_nested, opaque, scale, wobble
from precompile_capture import PrecompileError, ops

BLOCKS = ["blocks.0", "blocks.1"]


def frame_proto(m, name):
    return next(f for f in m.frames if f.name == name)


@pytest.fixture(scope="module")
def blocks_artifact(tmp_path_factory):
    model = make_blocks()
    cap = precompile_capture.capture(model, name="blocks", frames=BLOCKS)
    x = torch.randn(8, 4)
    cap(x, steps=0)
    cap(x, steps=1)
    return model, cap.save(tmp_path_factory.mktemp("blocks") / "out")


def test_auto_saves_a_python_program_for_a_frame_torchscript_cannot_script(blocks_artifact):
    _, path = blocks_artifact
    m = read_manifest(path)
    forward = frame_proto(m, "forward")
    assert forward.eager_fallback
    assert forward.python_program.path == "frames/forward/python.pt"
    assert forward.eager_program_path == ""
    assert not frame_proto(m, "blocks.0").HasField("python_program")
    assert m.python.python_version == platform.python_version()
    # What the program imports: the model's own package and torch.
    assert [(mod.name, mod.version) for mod in m.python.modules] == [
        ("examples", ""), ("torch", importlib.metadata.version("torch"))]
    assert "# eager program: Python" in open(os.path.join(path, "FRAMES")).read()


def test_the_program_is_the_frames_code_with_its_callees_dispatched(blocks_artifact):
    model, path = blocks_artifact
    program = precompile_eager.load(os.path.join(path, "frames", "forward", "python.pt"), "cpu")
    assert type(program.target) is type(model)
    # The blocks are callers of the dispatcher, not copies of the blocks, and
    # so their weights are not in the file.
    assert [type(b) for b in program.target.blocks] == [precompile_eager.FrameCall] * 2
    assert os.path.getsize(os.path.join(path, "frames", "forward", "python.pt")) < 8192
    calls = []
    for i, block in enumerate(model.blocks):
        ops.register_frame(BLOCKS[i], lambda x, block=block, i=i: calls.append(i) or block(x))
    x = torch.randn(8, 4)
    leaves = program([x, 1])
    assert len(leaves) == 1 and torch.equal(leaves[0], model(x, steps=1))
    assert calls == [0, 1]


def test_torchscript_only_refuses_such_a_frame_with_the_ways_out():
    cap = precompile_capture.capture(make_blocks(), name="blocks", frames=BLOCKS, eager="torchscript")
    x = torch.randn(8, 4)
    cap(x, steps=0)
    with pytest.raises(PrecompileError) as e:
        cap(x, steps=1)
    assert "frame 'forward' cannot be scripted for its eager program" in str(e.value)
    assert 'capture with eager="python"' in str(e.value)


def test_python_can_be_asked_for_a_frame_torchscript_could_script(tmp_path):
    cap = precompile_capture.capture(make_loop(), name="loop", eager="python")
    x = torch.randn(8, 4)
    cap(x, n=0)
    cap(x, n=1)
    m = read_manifest(cap.save(tmp_path / "out"))
    assert frame_proto(m, "forward").python_program.path == "frames/forward/python.pt"
    # Loop has no weights: its pickle names no torch class.
    assert [mod.name for mod in m.python.modules] == ["examples"]


def test_function_frames_keep_a_frame_from_a_python_program():
    cap = precompile_capture.capture(make_nested(), name="nested", frames=["encoder", scale, wobble],
                                     eager="python")
    with pytest.raises(PrecompileError) as e:
        cap(torch.randn(8, 4), 1)
    assert "cannot get a Python eager program: the capture has function frames (scale, wobble)" in str(e.value)


def test_code_the_server_cannot_import_is_refused_at_save(tmp_path):
    class Defined(torch.nn.Module):  # In a function: pickle cannot name it.
        def forward(self, x: torch.Tensor, n: int = 0) -> torch.Tensor:
            for _ in range(n):
                x = opaque(x)
            return x * 2.0

    cap = precompile_capture.capture(Defined(), name="local", eager="python")
    x = torch.randn(8, 4)
    cap(x, n=0)
    cap(x, n=1)
    with pytest.raises(PrecompileError) as e:
        cap.save(tmp_path / "out")
    assert "frame 'forward' cannot be saved as a Python eager program" in str(e.value)
    assert "top level of an importable module" in str(e.value)
    assert not (tmp_path / "out").exists()


P = precompile_eager.Param
PARAMS = [P("a", precompile_eager.POSITIONAL_ONLY), P("b", precompile_eager.POSITIONAL_OR_KEYWORD),
          P("c", precompile_eager.POSITIONAL_OR_KEYWORD, True, 3), P("d", precompile_eager.KEYWORD_ONLY, True, None)]


@pytest.mark.parametrize("args, kwargs, values", [
    ((1, 2), {}, [1, 2, 3, None]),
    ((1,), {"b": 2, "d": 4}, [1, 2, 3, 4]),
    ((1, 2, 5), {"d": "x"}, [1, 2, 5, "x"]),
])
def test_a_frame_call_binds_as_python_does(args, kwargs, values):
    assert precompile_eager.bind("f", PARAMS, args, kwargs) == values


def test_a_frame_call_binds_what_went_through_star_args_and_star_kwargs():
    # As the capture records them: args.0 after the named positional ones,
    # and the **kwargs keys it saw (absent ones are None).
    params = [P("x", precompile_eager.POSITIONAL_OR_KEYWORD), P("args.0", precompile_eager.VAR_POSITIONAL),
              P("scale", precompile_eager.VAR_KEYWORD), P("bias", precompile_eager.VAR_KEYWORD)]
    assert precompile_eager.bind("f", params, (1, 2), {"bias": 3}) == [1, 2, None, 3]
    with pytest.raises(TypeError, match="unexpected keyword arguments"):
        precompile_eager.bind("f", params, (1, 2), {"shift": 3})
    with pytest.raises(TypeError, match="unexpected keyword arguments"):
        precompile_eager.bind("f", params, (1,), {"args.0": 3})


@pytest.mark.parametrize("args, kwargs, message", [
    ((), {"a": 1, "b": 2}, "unexpected keyword arguments ['a']"),  # a is positional-only
    ((), {"b": 2}, "missing argument 'a'"),
    ((1,), {}, "missing argument 'b'"),
    ((1, 2, 3, 4), {}, "takes 3 positional arguments but 4 were given"),
    ((1, 2), {"b": 2}, "multiple values for argument 'b'"),
    ((1, 2), {"e": 0}, "unexpected keyword arguments ['e']"),
])
def test_a_frame_call_refuses_what_python_refuses(args, kwargs, message):
    with pytest.raises(TypeError) as e:
        precompile_eager.bind("f", PARAMS, args, kwargs)
    assert message in str(e.value)
