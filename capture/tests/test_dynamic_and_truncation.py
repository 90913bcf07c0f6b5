"""Automatic dynamic (static first, then a dynamic batch) and the recompile limit.

Five AOTInductor compiles.
"""

import dataclasses
import os

import pytest
import torch

import precompile_capture
import proto.artifact_pb2 as pb
from conftest import frame_proto, read_manifest
from models_for_tests import MLP


@pytest.fixture(scope="module")
def mlp():
    model = MLP().eval()
    cap = precompile_capture.capture(model, name="mlp", recompile_limit=2)
    xs = {b: torch.randn(b, 4) for b in (8, 16, 32)}
    cap(xs[8])  # static variant
    after_first = cap.frame("forward").variants
    cap(xs[16])  # batch changed: dynamic batch variant
    cap(xs[32])  # covered by the dynamic variant
    compiles_before_miss = len(cap.compile_log)
    cap(torch.randn(2, 8, 4))  # rank 3: a miss past the limit
    yield cap, model, xs, after_first, compiles_before_miss
    cap.close()


def test_first_capture_is_static_then_the_changed_dim_is_dynamic(mlp):
    cap, _, _, after_first, compiles_before_miss = mlp
    assert after_first == (("forward#0", "x: float32[8, 4]"),)
    assert cap.frame("forward").variants == (
        ("forward#0", "x: float32[8, 4]"),
        ("forward#1", "x: float32[s0 in [2, inf), 4]"),
    )
    assert compiles_before_miss == 2  # batch 32 hit the dynamic variant


def test_a_batch_no_variant_serves_is_named_when_the_artifact_is_saved(mlp, tmp_path):
    # Batch 1: Dynamo's dynamic batch starts at 2 and the static variant
    # takes 8. Batches 9, 17 and 33 take the dynamic variant; the rank-3
    # call, which no variant serves at any batch, is not a gap.
    cap = mlp[0]
    gaps = cap.batch_gaps()
    assert gaps == ["call 0, forward(x=float32[8, 4]), at batch 1"]
    with pytest.warns(RuntimeWarning, match=r"model 'mlp': no variant serves .*: call 0, forward\(x=float32\[8, 4\]\), "
                      r"at batch 1\. Add example calls"):
        cap.save(tmp_path / "a", require_complete=False)


def test_static_shapes_name_no_batch_gap():
    # dynamic=False: every shape its own variant, as the user asked.
    cap = precompile_capture.capture(MLP().eval(), name="mlp", dynamic=False)
    try:
        cap(torch.randn(8, 4))
        assert cap.batch_gaps() == []
    finally:
        cap.close()


def test_dynamic_is_automatic_or_static_never_forced():
    # dynamic=False is served by examples' mlp_static (tests/server_batching_test.cc).
    with pytest.raises(precompile_capture.PrecompileError, match="dynamic must be None"):
        precompile_capture.capture(MLP().eval(), name="mlp", dynamic=True)


def test_recompile_limit_hit_truncates_and_does_not_flag(mlp):
    cap = mlp[0]
    info = cap.frame("forward")
    assert info.truncated
    assert not info.eager_fallback and info.fallback_cause is None
    s = cap.summary()
    assert s.truncated
    assert s.eager_fallbacks == ()
    assert s.uncovered_frames == ()
    assert s.complete is False
    assert len(cap.compile_log) == 2


def test_save_requires_complete_names_the_truncation(mlp, tmp_path):
    cap = mlp[0]
    with pytest.raises(precompile_capture.PrecompileError) as e:
        cap.save(tmp_path / "a")
    msg = str(e.value)
    assert "model 'mlp' is incomplete" in msg
    assert "truncated: frames ['forward'] hit recompile_limit=2" in msg
    assert "require_complete=False" in msg
    assert not (tmp_path / "a").exists()


@pytest.fixture(scope="module")
def mlp_artifact(mlp, tmp_path_factory):
    return mlp[0].save(tmp_path_factory.mktemp("mlp") / "mlp", require_complete=False)


def test_incomplete_artifact_records_truncation_and_symbols(mlp_artifact):
    m = read_manifest(mlp_artifact)
    assert m.summary.truncated and not m.summary.complete
    f = frame_proto(m, "forward")
    assert f.truncated and not f.eager_fallback
    assert f.fallback_cause == pb.FALLBACK_CAUSE_UNSPECIFIED
    v0, v1 = f.variants
    assert [d.static_size for d in v0.guards[0].tensor.dims] == [8, 4]
    dims = v1.guards[0].tensor.dims
    assert dims[0].WhichOneof("size") == "symbol"
    assert dims[1].WhichOneof("size") == "static_size" and dims[1].static_size == 4
    (sym,) = v1.symbols
    assert sym.symbol == dims[0].symbol
    assert sym.min == 2 and not sym.HasField("max")
    assert sym.name.startswith("s")
    # The batch of the dynamic variant's output is symbolic too.
    assert [list(o.shape) for o in v0.outputs] == [[8, 3]]
    assert [list(o.shape) for o in v1.outputs] == [[-1, 3]]
    # The dynamic batch is the guards' symbol: the server knows an
    # output's size before the variant runs.
    assert [list(o.shape_symbols) for o in v1.outputs] == [[sym.symbol, -1]]
    assert [list(o.shape_symbols) for o in v0.outputs] == [[-1, -1]]
    with open(os.path.join(mlp_artifact, "FRAMES")) as fh:
        rows = fh.read().splitlines()
    assert rows[1] == "forward: 2 variants # truncated (recompile limit 2 hit)"
    assert rows[3] == "  forward#1: x: float32[s0 in [2, inf), 4]"


def test_saved_variants_run_through_aoti_and_match_eager(mlp, mlp_artifact):
    model, xs = mlp[1], mlp[2]
    static = torch._inductor.aoti_load_package(os.path.join(mlp_artifact, "frames/forward/0.pt2"))
    dynamic = torch._inductor.aoti_load_package(os.path.join(mlp_artifact, "frames/forward/1.pt2"))
    with torch.no_grad():
        torch.testing.assert_close(static(xs[8]), model(xs[8]))
        torch.testing.assert_close(dynamic(xs[32]), model(xs[32]))
        torch.testing.assert_close(dynamic(torch.ones(5, 4)), model(torch.ones(5, 4)))


def test_a_batch_dynamic_in_a_variant_is_not_a_fixed_size(mlp):
    # Batches 8, 16 and 32 varied, and forward#1 takes any from 2; the
    # rank-3 call, which no variant takes, says nothing of the others.
    assert mlp[0].static_sizes() == []


class RowsSummedOneByOne(torch.nn.Module):
    def forward(self, x):
        total = x[:, 0]
        for i in range(1, x.shape[1]):  # Dynamo unrolls it: x.size(1) specialized
            total = total + x[:, i]
        return total


def test_a_size_the_calls_varied_that_stays_fixed_is_named_when_saved(tmp_path):
    cap = precompile_capture.capture(RowsSummedOneByOne(), name="rows")
    try:
        cap(torch.randn(4, 3))
        cap(torch.randn(4, 5))
        assert cap.static_sizes() == ["x.size(1) (3, 5)"]
        with pytest.warns(RuntimeWarning, match=r"model 'rows': sizes the example calls varied are one fixed "
                                                r"size in every variant, .*: x\.size\(1\) \(3, 5\)\. Dynamo"):
            cap.save(tmp_path / "rows", require_complete=False)
    finally:
        cap.close()


def test_sizes_served_only_in_steps_are_named_with_the_next_size_served():
    # Guards as a pooled image's are: H a multiple of 32, W even and below
    # 100, the batch any; probed without compiling a model.
    from types import SimpleNamespace

    from precompile_capture.capture import size_steps
    from precompile_capture.export_guards import SizeRelation
    from precompile_capture.guards import ArgGuard, Dim, GuardSet, SymbolRange, TensorSpec

    guards = GuardSet(
        args=(ArgGuard(parameter=0, tensor=TensorSpec(torch.float32, "cpu", (
            Dim(symbol=0), Dim(static=3), Dim(symbol=1), Dim(symbol=2)))),
              ArgGuard(parameter=1, tensor=TensorSpec(torch.float32, "cpu", (Dim(symbol=0), Dim(symbol=2))))),
        symbols=(SymbolRange(0, 2, None, "s0"), SymbolRange(1, 2, None, "s1"), SymbolRange(2, 2, 99, "s2")),
        grad_enabled=torch.is_grad_enabled(), default_dtype=torch.get_default_dtype(),
        size_relations=(
            SizeRelation((("symbol", 1), ("constant", 32), ("op", "MOD")), "EQ", (("constant", 0),),
                         "x.size(2) % 32 == 0"),
            SizeRelation((("symbol", 2), ("constant", 2), ("op", "MOD")), "EQ", (("constant", 0),),
                         "x.size(3) % 2 == 0"),
        ))
    variants = [SimpleNamespace(guards=guards)]
    names = ["x", "mask"]
    call = [torch.empty(2, 3, 96, 80), torch.empty(2, 80)]
    assert size_steps(variants, call, names) == [
        "x.size(2) at 96 and next at 128 (97 to 127 are refused)",
        "x.size(2) at none of 2 to 31",
        "x.size(3) at 80 and next at 82 (81 is refused)",
    ]
    # At W = 98 the next even size is past the range; a call no variant
    # serves says nothing.
    assert size_steps(variants, [torch.empty(2, 3, 96, 98), torch.empty(2, 98)], names) == [
        "x.size(2) at 96 and next at 128 (97 to 127 are refused)",
        "x.size(2) at none of 2 to 31",
        "x.size(3) at 98 and at none of 99 to 162",
    ]
    assert size_steps(variants, [torch.empty(2, 3, 95, 80), torch.empty(2, 80)], names) == []
    # A parity after floor divisions, as AlexNet's pooling keeps: W served
    # when ((((W - 7) // 8) - 3) // 2 - 2) is odd, a run of 16 sizes in
    # every 32, so the size after the call's is served but not all above it
    # (and not 224). The warning said "from 79 up".
    def floor_div(steps, by):
        return steps + (("constant", by), ("op", "FLOOR_DIV"))

    def plus(steps, constant):
        return steps + (("constant", constant), ("op", "ADD"))

    pooled = plus(floor_div(plus(floor_div(plus((("symbol", 2),), -7), 8), -3), 2), -2)
    runs = dataclasses.replace(guards, symbols=guards.symbols[:2] + (SymbolRange(2, 63, None, "s2"),),
                               size_relations=(SizeRelation(
                                   pooled + (("constant", 2), ("op", "MOD")), "EQ", (("constant", 1),),
                                   "((((x.size(3) - 7) // 8 - 3) // 2) - 2) % 2 == 1"),))
    assert size_steps([SimpleNamespace(guards=runs)], call, names) == [
        "x.size(3) at 80 to 94, then at none of 95 to 110, next at 111",
        "x.size(3) at none of 63 to 78",
    ]
    # A guard relating two sizes asks them to move together: not a step.
    related = dataclasses.replace(guards, size_relations=(
        SizeRelation((("symbol", 1),), "EQ", (("symbol", 2), ("constant", 16), ("op", "ADD")),
                     "x.size(2) == x.size(3) + 16"),))
    assert size_steps([SimpleNamespace(guards=related)], call, names) == []


class Halves(torch.nn.Module):
    """Its two halves meet only for an even width: eager refuses odd ones."""

    def forward(self, x):
        return torch.cat([x[:, ::2], x[:, 1::2]], dim=0) * 1.0


def test_an_example_call_eager_refuses_too_is_said_to_be_the_calls_fault():
    # Dynamo's message only hinted at it ("Your code may result in an error
    # when running in eager"), after its fake-tensor trace.
    cap = precompile_capture.capture(Halves(), name="halves")
    cap(torch.rand(2, 8))
    with pytest.raises(precompile_capture.PrecompileError,
                       match=r"capturing forward\(x=float32\[3, 9\]\) failed, and the call fails in eager too "
                             r"\(RuntimeError: Sizes of tensors must match"):
        cap(torch.rand(3, 9))
