"""A frame that compiles, then falls back (graph break in a loop); its artifact.

One AOTInductor compile (an empty graph: n=0 returns the input).
"""

import os
import re

import pytest
import torch

import precompile_capture
import proto.artifact_pb2 as pb
from conftest import files_on_disk, frame_proto, jit_load, read_manifest, sha256
from models_for_tests import Loop


@pytest.fixture(scope="module")
def loop():
    model = Loop()
    cap = precompile_capture.capture(model, name="loop")
    x = torch.randn(8, 4)
    results = [
        cap(x, 0),  # compiles (empty graph)
        cap(x, n=2),  # graph break in the loop: flagged
        cap(x),  # default n=0: the frame is flagged, so it runs eagerly
    ]
    yield cap, model, x, results
    cap.close()


@pytest.fixture(scope="module")
def artifact(loop, tmp_path_factory):
    cap = loop[0]
    out = tmp_path_factory.mktemp("artifacts") / "loop"
    path = cap.save(out)
    return path


def test_calls_return_the_programs_results(loop):
    _, _, x, results = loop
    assert torch.equal(results[0], x)
    assert torch.allclose(results[1], (x * 2 + 1) * 2 + 1)
    assert torch.equal(results[2], x)


def test_graph_break_in_a_loop_flags_the_frame_and_keeps_its_variant(loop):
    cap = loop[0]
    s = cap.summary()
    assert s == precompile_capture.PrecompileSummary(
        frames=("forward",),
        variants_per_frame={"forward": 1},
        eager_fallbacks=("forward",),
        uncovered_frames=(),
        truncated=False,
        complete=True,
    )
    info = cap.frame("forward")
    assert info.eager_fallback
    assert info.fallback_cause is precompile_capture.FallbackCause.GRAPH_BREAK
    assert info.fallback_detail.startswith("Skip calling `torch.compiler.disable()`d function")
    assert info.fallback_exception == "torch._dynamo.exc.Unsupported"
    assert not info.variantless_entry_fallback
    assert info.variants == (("forward#0", "x: float32[8, 4], n == 0"),)
    assert info.parameters == (("x", "TENSOR"), ("n", "INT"))
    assert info.calls == 3
    assert len(cap.compile_log) == 1


def test_artifact_layout_and_checksums(artifact):
    on_disk = files_on_disk(artifact)
    assert on_disk == {"MANIFEST.pb", "FRAMES", "frames/forward/eager.pt", "frames/forward/0.pt2"}
    m = read_manifest(artifact)
    listed = {f.path: f for f in m.files}
    assert set(listed) == on_disk - {"MANIFEST.pb"}
    for rel, digest in listed.items():
        path = os.path.join(artifact, rel)
        assert digest.sha256 == sha256(path), rel
        assert re.fullmatch(r"[0-9a-f]{64}", digest.sha256)
        assert digest.size_bytes == os.path.getsize(path)
    # No temporary directory is left beside the artifact.
    assert os.listdir(os.path.dirname(artifact)) == ["loop"]


def test_manifest_fields(artifact):
    m = read_manifest(artifact)
    assert m.format_version == pb.FORMAT_VERSION_2
    assert m.torch_version == torch.__version__
    assert m.device == "cpu"
    assert m.cpu_isa == torch.backends.cpu.get_cpu_capability()
    assert m.model_name == "loop"
    assert m.entry_frame == "forward"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", m.created_at)
    assert m.capture_version == precompile_capture.__version__
    assert list(m.summary.frames) == ["forward"]
    assert dict(m.summary.variants_per_frame) == {"forward": 1}
    assert list(m.summary.eager_fallbacks) == ["forward"]
    assert list(m.summary.uncovered_frames) == []
    assert m.summary.complete and not m.summary.truncated

    f = frame_proto(m, "forward")
    assert [(p.name, p.kind) for p in f.parameters] == [
        ("x", pb.Parameter.TENSOR),
        ("n", pb.Parameter.INT),
    ]
    assert not f.parameters[0].HasField("default_value")
    assert f.parameters[0].example_dtype == pb.DTYPE_FLOAT32
    assert f.parameters[1].default_value.int_value == 0
    assert [p.binding for p in f.parameters] == [pb.Parameter.POSITIONAL_OR_KEYWORD] * 2
    # Every call passed x; n was passed as 1 (not its default) once.
    assert [p.passed for p in f.parameters] == [True, True]
    assert [(leaf.name, leaf.is_tensor) for leaf in f.outputs.leaves] == [("output0", True)]
    assert f.outputs.tree_spec == "*"
    assert f.eager_fallback and f.fallback_cause == pb.GRAPH_BREAK
    assert "torch.compiler.disable()" in f.fallback_detail
    assert f.eager_program_path == "frames/forward/eager.pt"
    assert not f.truncated and not f.variantless_entry_fallback

    (v,) = f.variants
    assert v.id == "forward#0"
    assert v.package_path == "frames/forward/0.pt2"
    assert list(v.tensor_inputs) == [0]
    assert v.num_outputs == 1
    assert [(o.dtype, list(o.shape)) for o in v.outputs] == [(pb.DTYPE_FLOAT32, [8, 4])]
    assert v.captured_from == "call 0: forward(x=float32[8, 4], n=0)"
    assert v.global_state.grad_enabled is False
    assert v.global_state.default_dtype == pb.DTYPE_FLOAT32
    assert len(v.guards) == 2
    g0, g1 = v.guards
    assert g0.parameter == 0 and g0.tensor.dtype == pb.DTYPE_FLOAT32 and g0.tensor.device == "cpu"
    assert [d.static_size for d in g0.tensor.dims] == [8, 4]
    assert g1.parameter == 1 and g1.equals.int_value == 0
    assert g1.equals.WhichOneof("value") == "int_value"
    assert list(v.symbols) == []


def test_frames_file_marks_the_eager_fallback(artifact):
    with open(os.path.join(artifact, "FRAMES")) as f:
        lines = f.read().splitlines()
    assert lines[0] == (
        f"# precompile artifact: model loop, torch {torch.__version__}, device cpu, "
        f"cpu isa {torch.backends.cpu.get_cpu_capability()}"
    )
    # Where the break is in models_for_tests.py, cut to the row's length.
    assert re.fullmatch(
        r"forward: 1 variant # eager fallback \(GRAPH_BREAK: Skip calling `torch.compiler.disable\(\)`d "
        r"function \(at models_for_tests.py:\d+ in forward: .*\) # eager program: TorchScript", lines[1])
    assert lines[2] == "  forward#0: x: float32[8, 4], n == 0"
    assert lines[3] == "  returns [output0]"
    assert len(lines) == 4


def test_empty_graph_variant_runs_through_aoti(artifact, loop):
    x = loop[2]
    runner = torch._inductor.aoti_load_package(os.path.join(artifact, "frames/forward/0.pt2"))
    out = runner(x)
    assert torch.equal(out, x)


def test_eager_program_runs_with_torch_jit(artifact, loop):
    model, x = loop[1], loop[2]
    program = jit_load(os.path.join(artifact, "frames/forward/eager.pt"))
    schema = program.forward.schema
    assert [str(a.type) for a in schema.arguments[1:]] == ["Tensor", "int"]
    assert [a.name for a in schema.arguments[1:]] == ["x", "n"]
    with torch.no_grad():
        assert torch.allclose(program(x, 3), model(x, 3))
        assert torch.equal(program(x), x)  # The recorded default n=0.


def test_save_replaces_a_previous_artifact_but_not_other_directories(loop, tmp_path):
    cap = loop[0]
    target = tmp_path / "art"
    cap.save(target)
    (target / "stray").write_text("left over")
    cap.save(target)
    assert not (target / "stray").exists()
    assert (target / "MANIFEST.pb").exists()
    assert sorted(os.listdir(tmp_path)) == ["art"]

    empty = tmp_path / "empty"
    empty.mkdir()
    cap.save(empty)
    assert (empty / "FRAMES").exists()

    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    with pytest.raises(precompile_capture.PrecompileError, match="not empty and holds no MANIFEST.pb"):
        cap.save(other)
    assert os.listdir(other) == ["notes.txt"]
    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(precompile_capture.PrecompileError, match="not a directory"):
        cap.save(a_file)
    assert sorted(os.listdir(tmp_path)) == ["art", "empty", "file", "other"]
