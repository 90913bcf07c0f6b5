"""Python eager programs: what the capture saves for a flagged frame
TorchScript cannot script, and what it refuses."""

import importlib.metadata
import os
import platform
import subprocess
import sys
import zipfile

import cloudpickle
import pytest
import torch

import precompile_capture
import precompile_eager
from conftest import read_manifest
from examples.models import make_blocks, make_loop, make_nested, opaque, scale, wobble
from precompile_capture import PrecompileError, ops, python_program

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
    # What the program imports: torch, and cloudpickle to rebuild the model's
    # own code (examples.models: no distribution provides it), which travels
    # by value and so is no module the server must have.
    assert [(mod.name, mod.version) for mod in m.python.modules] == [
        ("cloudpickle", importlib.metadata.version("cloudpickle")),
        ("torch", importlib.metadata.version("torch"))]
    [code] = forward.python_program.code_by_value
    # Block is there as the class Blocks.__init__ names, not as the blocks,
    # which are frames of their own.
    assert (code.module, list(code.qualified_names)) == ("examples.models", ["Block", "Blocks", "opaque"])
    frames = open(os.path.join(path, "FRAMES")).read()
    assert "# eager program: Python" in frames
    assert f"  Python by value: examples.models: Block, Blocks, opaque (sha256 {code.sha256[:16]})" in frames


def test_the_program_is_the_frames_code_with_its_callees_dispatched(blocks_artifact):
    model, path = blocks_artifact
    program = precompile_eager.load(os.path.join(path, "frames", "forward", "python.pt"), "cpu")
    assert type(program.target) is type(model)
    # The blocks are callers of the dispatcher, not copies of the blocks, and
    # so their weights are not in the file.
    assert [type(b) for b in program.target.blocks] == [precompile_eager.FrameCall] * 2
    with zipfile.ZipFile(os.path.join(path, "frames", "forward", "python.pt")) as saved:
        assert not [n for n in saved.namelist() if "/data/" in n]  # No tensor at all.
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
    # Loop has no weights, but its code, which travels by value, refers to
    # torch (the module and the base class).
    assert [mod.name for mod in m.python.modules] == ["cloudpickle", "torch"]


def test_function_frames_called_from_imported_code_keep_a_frame_from_a_python_program(monkeypatch):
    # As if an installed distribution provided examples: its code would go by
    # reference, and at the server it would call the original `scale` and
    # `wobble` instead of dispatching them.
    monkeypatch.setitem(python_program._distributions(), "examples", ["examples-dist"])
    cap = precompile_capture.capture(make_nested(), name="nested", frames=["encoder", scale, wobble],
                                     eager="python")
    with pytest.raises(PrecompileError) as e:
        cap(torch.randn(8, 4), 1)
    assert ("cannot get a Python eager program: its code calls function frame 'scale' from module "
            "examples.models, which an installed distribution provides") in str(e.value)


# In a fresh Python with only the capture package's directory on its path:
# checks that the modules named last cannot be imported, loads the program,
# runs it on the saved arguments and prints whether its first output equals
# the saved result.
LOAD_ELSEWHERE = """
import sys, torch
sys.path[:0] = [sys.argv[3]]
import precompile_eager
for module in sys.argv[4:]:
    try:
        __import__(module)
        raise SystemExit(f"{module} is importable here")
    except ImportError:
        pass
program = precompile_eager.load(sys.argv[1], "cpu")
values, expected = torch.load(sys.argv[2])
print(torch.equal(program(values)[0], expected) or program(values)[0])
"""


def load_elsewhere(tmp_path, program_path, values, expected, absent):
    """LOAD_ELSEWHERE's run: its exit status and what it printed."""
    torch.save((values, expected), tmp_path / "call.pt")
    capture_dir = os.path.dirname(os.path.dirname(precompile_capture.__file__))
    return subprocess.run(
        [sys.executable, "-c", LOAD_ELSEWHERE, str(program_path), str(tmp_path / "call.pt"), capture_dir,
         *absent],
        capture_output=True, text=True, cwd=tmp_path, env={"PATH": os.environ["PATH"]}, timeout=120)


def test_code_defined_in_a_function_travels_by_value(tmp_path):
    factor = 2.0

    class Defined(torch.nn.Module):  # In a function: pickle cannot name it.
        def forward(self, x: torch.Tensor, n: int = 0) -> torch.Tensor:
            for _ in range(n):
                x = opaque(x)
            return x * factor

    cap = precompile_capture.capture(Defined(), name="local", eager="python")
    x = torch.randn(8, 4)
    cap(x, n=0)
    cap(x, n=1)
    path = cap.save(tmp_path / "out")
    m = read_manifest(path)
    codes = {c.module: list(c.qualified_names) for c in frame_proto(m, "forward").python_program.code_by_value}
    assert codes == {
        "examples.models": ["opaque"],
        __name__: ["test_code_defined_in_a_function_travels_by_value.<locals>.Defined"],
    }
    # Loaded where neither this file nor examples.models can be imported, it runs
    # the code as it was captured (its closure's factor included).
    run = load_elsewhere(tmp_path, os.path.join(path, "frames", "forward", "python.pt"), [x, 2],
                         Defined()(x, n=2), ["examples.models", "test_python_program"])
    assert run.returncode == 0 and run.stdout.strip() == "True", run.stdout + run.stderr


def test_a_namespace_package_only_on_sys_path_travels_by_value_with_what_it_imports(tmp_path, monkeypatch):
    # No __init__.py: a namespace package, as much code on sys.path is. Its
    # modules reach each other through a module global, which only pickling
    # by value reveals.
    package = tmp_path / "code" / "userns"
    package.mkdir(parents=True)
    (package / "helpers.py").write_text("def shift(x):\n    return x + 1.5\n")
    (package / "mods.py").write_text(
        "import torch\nfrom userns import helpers\n\n"
        "class Shifted(torch.nn.Module):\n"
        "    def forward(self, x):\n        return helpers.shift(x) * 2.0\n")
    monkeypatch.syspath_prepend(str(tmp_path / "code"))
    from userns import mods  # noqa: PLC0415

    program = precompile_eager.Program("forward", mods.Shifted(), [P("x", precompile_eager.POSITIONAL_OR_KEYWORD)])
    data, pickled = python_program._save(program)
    assert sorted(pickled.by_value) == ["userns.helpers", "userns.mods"]
    assert "userns" not in {m.split(".")[0] for m in pickled.by_reference}
    # The registrations were undone: nothing else pickles userns by value.
    assert not cloudpickle.list_registry_pickle_by_value()
    (tmp_path / "python.pt").write_bytes(data)
    x = torch.randn(3)
    run = load_elsewhere(tmp_path, tmp_path / "python.pt", [x], mods.Shifted()(x), ["userns"])
    assert run.returncode == 0 and run.stdout.strip() == "True", run.stdout + run.stderr


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


def test_a_program_passes_keywords_as_the_frames_callers_do():
    # transformers' merge_with_config_defaults adds use_cache=config.use_cache
    # where no keyword names it: given use_cache by position as well, the
    # decorated forward raised "multiple values for argument 'use_cache'".
    def use_cache_from_config(forward):
        def wrapper(self, *args, **kwargs):
            if kwargs.get("use_cache") is None:
                kwargs["use_cache"] = True
            return forward(self, *args, **kwargs)
        return wrapper

    class Model(torch.nn.Module):
        @use_cache_from_config
        def forward(self, x, use_cache=None, **kwargs):
            return x * 2 if use_cache else x + 1000

    program = precompile_eager.Program("forward", Model(), [
        P("x", precompile_eager.POSITIONAL_OR_KEYWORD), P("use_cache", precompile_eager.POSITIONAL_OR_KEYWORD, True, None)])
    x = torch.ones(2)
    assert torch.equal(program([x, None])[0], x * 2)
    assert torch.equal(program([x, False])[0], x + 1000)


def test_a_program_passes_required_inputs_by_position_for_the_modules_hooks():
    # A forward pre-hook gets the inputs passed by position only: given x by
    # keyword, this one would find none.
    model = torch.nn.Identity()
    model.register_forward_pre_hook(lambda module, inputs: (inputs[0] * 2,))
    program = precompile_eager.Program("forward", model, [P("input", precompile_eager.POSITIONAL_OR_KEYWORD)])
    x = torch.ones(2)
    assert torch.equal(program([x])[0], x * 2)
