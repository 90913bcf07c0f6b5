"""How each cause is detected, the two exclusions, and the refusal of an entry
that fell back on its first call. No AOTInductor compile happens here."""

import inspect
import os
import threading
import warnings

import pytest
import torch
import torch._dynamo.exc as dynamo_exc

import precompile_capture
from precompile_capture import FallbackCause, PrecompileError
import proto.artifact_pb2 as pb
from conftest import frame_proto, read_manifest
from models_for_tests import DataDependent, DataDependentBranch, Generator, Loop, Plain, SkipsFrame


def _variantless(model, *args, **kw):
    cap = precompile_capture.capture(model, name="m", **kw)
    result = cap(*args)
    return cap, result


def _assert_variantless_entry(cap, cause):
    info = cap.frame("forward")
    assert info.eager_fallback and info.fallback_cause is cause
    assert info.variantless_entry_fallback
    assert info.variants == ()
    s = cap.summary()
    assert s.uncovered_frames == ("forward",)
    assert s.eager_fallbacks == ()
    assert s.complete is False
    assert s.truncated is False


def _assert_refused(cap, tmp_path, cause_words):
    for require_complete in (True, False):
        target = tmp_path / f"out-{require_complete}"
        with pytest.raises(PrecompileError) as e:
            cap.save(target, require_complete=require_complete)
        msg = str(e.value)
        assert "the entry frame 'forward' fell back to eager on its first call" in msg
        assert cause_words in msg
        assert "has no compiled variant to dispatch to" in msg
        assert "require_complete=False does not get past it" in msg
        assert not target.exists()


def test_generator_entry(tmp_path):
    x = torch.randn(3)
    cap, result = _variantless(Generator(), x)
    assert torch.equal(next(result), x * 2)
    _assert_variantless_entry(cap, FallbackCause.GENERATOR)
    assert "generator function" in cap.frame("forward").fallback_detail
    _assert_refused(cap, tmp_path, "GENERATOR: a frame Dynamo refuses to trace (a generator)")


def test_skip_frame_entry(tmp_path):
    x = torch.randn(3)
    cap, result = _variantless(SkipsFrame(), x)
    assert torch.equal(result, x + 1)
    _assert_variantless_entry(cap, FallbackCause.SKIP_FRAME)
    assert cap.frame("forward").fallback_exception == "torch._dynamo.exc.Unsupported"
    _assert_refused(cap, tmp_path, "SKIP_FRAME: a torch._dynamo.skip_frame() call")


def test_data_dependent_control_flow_is_a_suppressed_user_error(tmp_path):
    x = torch.tensor([1.0, 0.0, 2.0, 3.0])
    cap, result = _variantless(DataDependent(), x, True)
    assert torch.equal(result, x * 2)
    _assert_variantless_entry(cap, FallbackCause.USER_ERROR)
    info = cap.frame("forward")
    # The flagged exception really is a UserError (a subclass of Unsupported).
    assert info.fallback_exception == "torch._dynamo.exc.UserError"
    assert "Could not guard on data-dependent expression" in info.fallback_detail
    # The refusal quotes the first line: it names the model's line that
    # gave up (Longformer's `if is_global_attn:` was otherwise nowhere).
    line = inspect.getsourcelines(DataDependent.forward)[1] + 2
    assert info.fallback_detail.splitlines()[0].endswith(f"models_for_tests.py:{line}, in forward]")
    _assert_refused(cap, tmp_path, "USER_ERROR: a UserError Dynamo suppressed")
    with pytest.raises(PrecompileError, match=rf"models_for_tests.py:{line}, in forward\]"):
        cap.save(tmp_path / "sited")


def test_graph_break_on_the_first_call(tmp_path):
    x = torch.randn(3)
    cap, result = _variantless(Loop(), x, 1)
    assert torch.allclose(result, x * 2 + 1)
    _assert_variantless_entry(cap, FallbackCause.GRAPH_BREAK)
    _assert_refused(cap, tmp_path, "GRAPH_BREAK: a graph break Dynamo cannot resume from")


class SetUpOnFirstCall(torch.nn.Module):
    """Set-up on the first call only, under a lock (as transformers installs
    its output-capturing hooks)."""

    lock = threading.Lock()

    def __init__(self):
        super().__init__()
        self.ready = False

    def forward(self, x):
        if not self.ready:
            with self.lock:
                self.ready = True
        return x + 1


class LockedOnEveryCall(torch.nn.Module):
    lock = threading.Lock()

    def forward(self, x):
        with self.lock:
            return x + 1


def test_a_graph_break_says_where_in_the_users_code_it_is(tmp_path):
    cap, _ = _variantless(LockedOnEveryCall(), torch.randn(3))
    with pytest.raises(PrecompileError) as e:
        cap.save(tmp_path / "out")
    msg = str(e.value)
    line = LockedOnEveryCall.forward.__code__.co_firstlineno + 1
    assert f"Unsupported context manager (at {os.path.basename(__file__)}:{line} in forward: with self.lock:)" in msg
    assert "not set-up on a first call alone" in msg


def test_data_dependent_branching_is_a_graph_break():
    x = torch.ones(3)
    cap, result = _variantless(DataDependentBranch(), x)
    assert torch.equal(result, x * 2)
    info = cap.frame("forward")
    assert info.fallback_cause is FallbackCause.GRAPH_BREAK
    assert info.fallback_detail.startswith("Data-dependent branching")


def test_backend_skip_frame_via_decline(tmp_path):
    seen = []

    def decline(ep):
        seen.append(ep)
        raise dynamo_exc.SkipFrame("bf16 is not supported here")

    x = torch.randn(3)
    cap, result = _variantless(Plain(), x, decline=decline)
    assert torch.equal(result, x * 3 + 1)
    assert len(seen) == 1 and isinstance(seen[0], torch.export.ExportedProgram)
    _assert_variantless_entry(cap, FallbackCause.BACKEND_SKIP)
    assert "bf16 is not supported here" in cap.frame("forward").fallback_detail
    _assert_refused(cap, tmp_path, "BACKEND_SKIP: the backend declined the graph (SkipFrame)")
    cap(x)
    assert len(seen) == 1  # the frame is skipped from then on


def test_compile_error_raises_unless_suppressed():
    def decline(ep):
        raise RuntimeError("no backend today")

    cap = precompile_capture.capture(Plain(), name="m", decline=decline)
    with pytest.raises(PrecompileError) as e:
        cap(torch.randn(3))
    msg = str(e.value)
    assert "frame 'forward'" in msg
    assert "the backend's decline hook failed: RuntimeError: no backend today" in msg
    assert "suppress_errors=True" in msg


@pytest.fixture(scope="module")
def suppressed():
    attempts = []

    def decline(ep):
        attempts.append(ep)
        raise RuntimeError("no backend today")

    cap = precompile_capture.capture(Plain(), name="plain", suppress_errors=True, decline=decline)
    x = torch.randn(3)
    with pytest.warns(RuntimeWarning, match="no backend today"):
        first = cap(x)
    second = cap(x)
    yield cap, x, first, second, attempts
    cap.close()


def test_suppressed_compile_error_is_not_an_eager_fallback(suppressed):
    cap, x, first, second, attempts = suppressed
    assert torch.equal(first, x * 3 + 1) and torch.equal(second, x * 3 + 1)
    assert len(attempts) == 1  # Dynamo skips the frame after the error
    info = cap.frame("forward")
    assert not info.eager_fallback and info.fallback_cause is None
    assert not info.variantless_entry_fallback
    assert "no backend today" in info.compile_error
    assert cap.summary() == precompile_capture.PrecompileSummary(
        frames=("forward",),
        variants_per_frame={"forward": 0},
        eager_fallbacks=(),
        uncovered_frames=("forward",),
        truncated=False,
        complete=False,
    )


def test_suppressed_compile_error_save(suppressed, tmp_path):
    cap = suppressed[0]
    with pytest.raises(PrecompileError) as e:
        cap.save(tmp_path / "strict")
    assert "uncovered frames: 'forward' (compile error suppressed: " in str(e.value)
    assert "no backend today" in str(e.value)
    path = cap.save(tmp_path / "lenient", require_complete=False)
    m = read_manifest(path)
    f = frame_proto(m, "forward")
    assert not f.eager_fallback and f.fallback_cause == pb.FALLBACK_CAUSE_UNSPECIFIED
    assert len(f.variants) == 0
    assert list(m.summary.uncovered_frames) == ["forward"] and not m.summary.complete
    with open(os.path.join(path, "FRAMES")) as fh:
        assert fh.read().splitlines()[1] == "forward: 0 variants # uncovered (compile error suppressed)"


def test_a_compile_error_after_a_variant_leaves_its_frame_incomplete(tmp_path):
    # The frame's first call compiles; its second does not, and Dynamo skips
    # the frame from then on: the calls after the error are not captured,
    # and the server would refuse them. Once, that saved as complete.
    exported = []

    def decline(ep):
        exported.append(ep)
        if len(exported) == 2:
            raise RuntimeError("no backend for this one")

    cap = precompile_capture.capture(Plain(), name="plain", suppress_errors=True, decline=decline)
    try:
        cap(torch.randn(4))
        with pytest.warns(RuntimeWarning, match="no backend for this one"):
            cap(torch.randn(6))
        cap(torch.randn(8))
        s = cap.summary()
        assert s.variants_per_frame == {"forward": 1}
        assert s.uncovered_frames == ("forward",) and not s.complete
        with pytest.raises(PrecompileError) as e:
            cap.save(tmp_path / "strict")
        assert "'forward' (compile error suppressed: " in str(e.value)
        path = cap.save(tmp_path / "lenient", require_complete=False)
        with open(os.path.join(path, "FRAMES")) as fh:
            assert fh.read().splitlines()[1] == (
                "forward: 1 variant # incomplete (compile error suppressed: the calls after it were "
                "not captured)")
    finally:
        cap.close()


def test_warnings_are_quiet_on_a_plain_run(suppressed):
    cap, x = suppressed[0], suppressed[1]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cap(x)


def _uncompiled_capture(model):
    """A capture whose only frame stays uncovered (its compile error is suppressed)."""

    def decline(ep):
        raise RuntimeError("not compiling in this test")

    return precompile_capture.capture(model, name="m", suppress_errors=True, decline=decline)


def test_an_unflagged_frame_needs_no_torchscript(tmp_path):
    from models_for_tests import UsesLambda

    cap = _uncompiled_capture(UsesLambda())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        assert torch.equal(cap(torch.zeros(2)), torch.ones(2))
    # It never runs eagerly at serve time, so TorchScript is never asked.
    m = read_manifest(cap.save(tmp_path / "out", require_complete=False))
    assert frame_proto(m, "forward").eager_program_path == ""


def test_a_flagged_frame_torchscript_cannot_compile_is_an_error_at_its_call(tmp_path):
    from models_for_tests import Calls, UsesLambda

    # The entry breaks inside inner's loop too: both are flagged on their first call.
    cap = precompile_capture.capture(Calls(UsesLambda(), 2), name="m", frames=["inner"], eager="torchscript")
    with pytest.raises(PrecompileError) as e:
        cap(torch.zeros(2))
    msg = str(e.value)
    assert msg.startswith("frame 'inner' cannot be scripted for its eager program: ")
    assert "Lambda" in msg or "lambda" in msg
    assert "Frame 'inner' is flagged eager_fallback (GRAPH_BREAK: " in msg
    # Reported before anything was compiled: each frame traced twice, the
    # second time after one eager run.
    assert cap.export_count == 4


def test_a_parameter_torchscript_types_differently_is_an_error_at_its_call(tmp_path):
    from models_for_tests import Calls, UnannotatedInt

    cap = precompile_capture.capture(Calls(UnannotatedInt(), 3), name="m", frames=["inner"], eager="torchscript")
    with pytest.raises(PrecompileError) as e:
        cap(torch.ones(2))
    assert cap.frame("inner").parameters == (("x", "TENSOR"), ("n", "INT"))
    assert str(e.value).startswith(
        "frame 'inner': TorchScript types parameter 'n' as Tensor but the capture saw INT; annotate it"
    )


def test_a_frame_no_call_reached_is_uncovered_and_gets_no_eager_program(tmp_path):
    from models_for_tests import Nested, picky, scale

    model = Nested().eval()

    def decline(ep):
        raise RuntimeError("not compiling in this test")

    cap = precompile_capture.capture(
        model, name="n", frames=["encoder", scale, picky], suppress_errors=True, decline=decline
    )
    x = torch.randn(8, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        cap(x, 0)  # forward's compile error is suppressed: it runs eagerly, seeing its callees
    assert [cap.frame(n).calls for n in cap.frame_names] == [1, 1, 1, 0]
    s = cap.summary()
    assert s.uncovered_frames == ("forward", "encoder", "scale", "picky")
    with pytest.raises(PrecompileError) as e:
        cap.save(tmp_path / "strict")
    assert "'picky' (never called by the example calls)" in str(e.value)
    assert "'encoder' (compile error suppressed: " in str(e.value)
    path = cap.save(tmp_path / "lenient", require_complete=False)
    m = read_manifest(path)
    pk = frame_proto(m, "picky")
    # Never called and not flagged: nothing says what it returns, and it has
    # no eager program (only flagged frames may run eagerly).
    assert list(pk.outputs.leaves) == [] and pk.eager_program_path == ""
    assert [p.kind for p in pk.parameters] == [pb.Parameter.TENSOR]
    fwd = frame_proto(m, "forward")
    assert [leaf.name for leaf in fwd.outputs.leaves] == ["output0", "output1"]
    assert fwd.eager_program_path == ""


def test_a_frame_that_sets_itself_up_on_its_first_call_is_traced_after_it():
    traced = []

    def decline(ep):
        traced.append(ep)
        raise RuntimeError("not compiling in this test")

    model = SetUpOnFirstCall()
    cap = precompile_capture.capture(model, name="m", suppress_errors=True, decline=decline)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        assert torch.equal(cap(torch.ones(3)), torch.ones(3) + 1)
    # The trace after the eager run exported the frame: no fallback.
    assert len(traced) == 1
    assert not cap.frame("forward").eager_fallback


def test_a_frame_that_breaks_on_every_call_still_falls_back_after_one_eager_run(tmp_path):
    runs = []

    class Counted(DataDependentBranch):
        def forward(self, x):
            runs.append(1)
            return super().forward(x)

    x = torch.randn(3)
    cap, result = _variantless(Counted(), x)
    assert torch.equal(result, DataDependentBranch()(x))
    _assert_variantless_entry(cap, FallbackCause.GRAPH_BREAK)
    # Once before the second trace, once to answer the call.
    assert len(runs) == 2


def test_an_encoder_decoder_called_without_a_cache_is_told_what_keeps_it_compiled():
    # T5 called as its users call it, use_cache at its default and no cache,
    # builds one at every call from a deep copy of its config, which Dynamo
    # does not trace: the entry falls back, and its detail says how to call
    # it so that it compiles. Called so, Dynamo traces it whole (to the
    # backend, which this test has decline).
    from transformers import DynamicCache, EncoderDecoderCache, T5Config, T5ForConditionalGeneration

    torch.manual_seed(0)
    model = T5ForConditionalGeneration(T5Config(
        vocab_size=64, d_model=16, d_kv=4, d_ff=32, num_layers=1, num_heads=2,
        decoder_start_token_id=0)).eval()
    ids = torch.randint(0, 64, (1, 5))
    start = torch.zeros(1, 1, dtype=torch.int64)

    def decline(ep):
        raise dynamo_exc.SkipFrame("no compile in this test")

    plain = precompile_capture.capture(model, name="t5", decline=decline)
    plain(input_ids=ids, decoder_input_ids=start)
    info = plain.frame("forward")
    assert info.fallback_cause is FallbackCause.GRAPH_BREAK, info.fallback_detail
    first = info.fallback_detail.splitlines()[0]
    assert "in get_text_config" in first and "past_key_values=EncoderDecoderCache(" in first, first
    plain.close()

    cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
    advised = precompile_capture.capture(model, name="t5", decline=decline)
    advised(input_ids=ids, decoder_input_ids=start, past_key_values=cache)
    assert advised.frame("forward").fallback_cause is FallbackCause.BACKEND_SKIP
    advised.close()
