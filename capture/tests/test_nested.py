"""An entry that compiles, then falls back; its callees are captured during the
eager run; the eager program calls them through precompile::call_frame.

Three AOTInductor compiles (forward, encoder, scale).
"""

import os
import re

import pytest
import torch

import precompile_capture
import proto.artifact_pb2 as pb
from conftest import frame_proto, jit_load, read_manifest
import models_for_tests
from models_for_tests import Nested, picky, scale


@pytest.fixture(scope="module")
def nested():
    model = Nested().eval()
    cap = precompile_capture.capture(model, name="nested", frames=["encoder", scale, picky])
    x = torch.randn(8, 4)
    out = {}
    out[0] = cap(x, 0)  # compiles forward; its callees are inlined, not seen
    first = (cap.summary(), cap.frame("encoder"), cap.frame("scale"))
    out[1] = cap(x, k=1)  # graph break: forward flagged; encoder and scale compile
    out[2] = cap(x, 2)  # forward eager: encoder and scale hit; picky calls skip_frame()
    yield cap, model, x, first, out
    cap.close()


@pytest.fixture(scope="module")
def artifact(nested, tmp_path_factory):
    return nested[0].save(tmp_path_factory.mktemp("nested") / "nested")


def test_the_compiled_entry_inlines_its_callees(nested):
    _, _, _, first, _ = nested
    summary, encoder, scale_info = first
    assert summary.variants_per_frame == {"forward": 1, "encoder": 0, "scale": 0, "picky": 0}
    assert summary.uncovered_frames == ("encoder", "scale", "picky")
    assert summary.complete is False
    assert encoder.calls == 0 and scale_info.calls == 0


def test_callees_are_captured_during_the_entrys_eager_run(nested):
    cap = nested[0]
    assert cap.summary() == precompile_capture.PrecompileSummary(
        frames=("forward", "encoder", "scale", "picky"),
        variants_per_frame={"forward": 1, "encoder": 1, "scale": 1, "picky": 0},
        eager_fallbacks=("forward", "picky"),
        uncovered_frames=(),
        truncated=False,
        complete=True,
    )
    assert cap.frame("encoder").variants == (("encoder#0", "x: float32[8, 4]"),)
    assert cap.frame("scale").variants == (("scale#0", "y: float32[8, 6], factor == 2.0"),)
    assert cap.frame("encoder").calls == 2 and cap.frame("scale").calls == 2
    assert [name for name, _, _ in cap.compile_log] == ["forward", "encoder", "scale"]


def test_skip_frame_in_a_callee_flags_it_without_variants(nested):
    info = nested[0].frame("picky")
    assert info.eager_fallback
    assert info.fallback_cause is precompile_capture.FallbackCause.SKIP_FRAME
    assert info.fallback_detail.startswith("Call to `torch._dynamo.skip_frame()`")
    assert info.variants == ()
    assert not info.variantless_entry_fallback  # only an entry can be that


def test_results_are_the_programs(nested):
    _, model, x, _, out = nested
    with torch.no_grad():
        for k in (0, 1, 2):
            expected = model(x, k)
            assert isinstance(out[k], tuple) and len(out[k]) == 2
            for got, want in zip(out[k], expected):
                torch.testing.assert_close(got, want)


def test_manifest_frames(artifact):
    m = read_manifest(artifact)
    assert m.entry_frame == "forward"
    assert [f.name for f in m.frames] == ["forward", "encoder", "scale", "picky"]
    fwd = frame_proto(m, "forward")
    assert fwd.eager_fallback and fwd.fallback_cause == pb.GRAPH_BREAK
    assert len(fwd.variants) == 1 and not fwd.variantless_entry_fallback
    assert [leaf.name for leaf in fwd.outputs.leaves] == ["output0", "output1"]
    assert fwd.outputs.tree_spec == "tuple(*, *)"
    assert fwd.variants[0].num_outputs == 2
    sc = frame_proto(m, "scale")
    assert [(p.name, p.kind) for p in sc.parameters] == [("y", pb.Parameter.TENSOR), ("factor", pb.Parameter.FLOAT)]
    assert sc.parameters[1].default_value.float_value == 2.0
    (g_y, g_factor) = sc.variants[0].guards
    assert g_factor.parameter == 1 and g_factor.equals.float_value == 2.0
    assert sc.variants[0].package_path == "frames/scale/0.pt2"
    # Not flagged: it may never run eagerly, so it has no eager program.
    assert sc.eager_program_path == "" and not sc.eager_fallback
    assert not os.path.exists(os.path.join(artifact, "frames", "scale", "eager.pt"))
    assert list(sc.variants[0].tensor_inputs) == [0]
    pk = frame_proto(m, "picky")
    assert pk.eager_fallback and pk.fallback_cause == pb.SKIP_FRAME and len(pk.variants) == 0
    assert pk.eager_program_path == "frames/picky/eager.pt"
    assert list(m.summary.eager_fallbacks) == ["forward", "picky"]
    assert m.summary.complete


def test_frames_file_rows(artifact):
    with open(os.path.join(artifact, "FRAMES")) as f:
        rows = [r for r in f.read().splitlines()[1:] if not r.startswith("  ")]
    # The break's place in models_for_tests.py, cut to the row's length.
    assert re.fullmatch(
        r"forward: 1 variant # eager fallback \(GRAPH_BREAK: Skip calling `torch.compiler.disable\(\)`d "
        r"function \(at models_for_tests.py:\d+ in forward: .*\) # eager program: TorchScript", rows[0])
    assert rows[1:3] == ["encoder: 1 variant", "scale: 1 variant"]
    assert re.fullmatch(
        r"picky: 0 variants # eager fallback \(SKIP_FRAME: Call to `torch._dynamo.skip_frame\(\)` "
        r"\(at models_for_tests.py:\d+ in picky: torch._dynamo.skip_frame\(\)\)\) "
        r"# eager program: TorchScript", rows[3])
    assert len(rows) == 4


def test_eager_program_calls_callees_through_call_frame(artifact, nested):
    _, model, x, _, _ = nested
    program = jit_load(os.path.join(artifact, "frames/forward/eager.pt"))
    assert 'ops.precompile.call_frame("encoder"' in program.encoder.code
    calls = []

    def counting(name, fn):
        def run(*args):
            calls.append((name, tuple(type(a).__name__ for a in args)))
            return fn(*args)

        return run

    precompile_capture.register_frame("encoder", counting("encoder", model.encoder))
    precompile_capture.register_frame("scale", counting("scale", scale))
    precompile_capture.register_frame("picky", counting("picky", picky))
    try:
        with torch.no_grad():
            got = program(x, 2)
            want = model(x, 2)
    finally:
        precompile_capture.register_frame("encoder", model.encoder)
        precompile_capture.register_frame("scale", scale)
        precompile_capture.register_frame("picky", picky)
    assert calls == [("encoder", ("Tensor",)), ("scale", ("Tensor", "float")), ("picky", ("Tensor",))]
    assert isinstance(got, tuple) and len(got) == 2
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)


def test_only_flagged_callees_have_eager_programs(artifact, nested):
    x = nested[2]
    # encoder and scale are never run eagerly at serve time.
    assert sorted(os.listdir(os.path.join(artifact, "frames/scale"))) == ["0.pt2"]
    assert sorted(os.listdir(os.path.join(artifact, "frames/encoder"))) == ["0.pt2"]
    program = jit_load(os.path.join(artifact, "frames/picky/eager.pt"))
    assert [a.name for a in program.forward.schema.arguments[1:]] == ["y"]
    torch.testing.assert_close(program(x), picky(x))


def test_interception_is_removed_after_the_capture(nested):
    model = nested[1]
    assert "forward" not in model.encoder.__dict__
    assert models_for_tests.scale is scale
    assert models_for_tests.picky is picky
