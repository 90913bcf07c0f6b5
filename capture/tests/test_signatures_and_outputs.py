"""Signatures and outputs as real models write them.

Keyword-only parameters, `Optional[Tensor] = None`, `**kwargs`, and outputs
that are pytrees (dicts, tuples, dataclasses, with None and int leaves), the
way Hugging Face models are written; and the errors for what cannot be served,
raised at the call that shows them rather than at save().
"""

import dataclasses
import functools
import os
import pathlib
import sys
from typing import Optional

import pytest
import torch

import precompile_capture
import proto.artifact_pb2 as pb
from conftest import frame_proto, read_manifest
from models_for_tests import Calls, opaque
from precompile_capture import PrecompileError

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN = ROOT / "bazel-bin"
sys.path.insert(0, str(ROOT / "tests" / "testing"))


def skip_every_graph(ep):
    """A backend that declines every graph: frames fall back, nothing compiles."""
    raise torch._dynamo.exc.SkipFrame("not compiling in this test")


class KeywordModel(torch.nn.Module):
    """An embedding model with a transformers-style signature."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(50, 4)

    def forward(
        self,
        input_ids: torch.LongTensor,
        attention_mask: torch.Tensor | None = None,
        *,
        scale: float = 1.0,
        **kwargs,
    ):
        h = self.embed(input_ids) * scale
        if attention_mask is not None:
            h = h * attention_mask[..., None]
        bias = kwargs.get("bias")
        if bias is not None:
            h = h + bias
        return {"hidden": h, "pooled": (h.mean(1), None), "count": 3}


@pytest.fixture(scope="module")
def keyword_capture(tmp_path_factory):
    cap = precompile_capture.capture(KeywordModel().eval(), name="kw")
    ids = torch.randint(0, 50, (2, 5))
    cap(ids)
    cap(input_ids=ids, attention_mask=torch.ones(2, 5), bias=torch.randn(4))
    path = cap.save(tmp_path_factory.mktemp("kw") / "kw")
    yield cap, path
    cap.close()


def test_inputs_follow_the_signature_and_the_calls(keyword_capture):
    _, path = keyword_capture
    f = frame_proto(read_manifest(path), "forward")
    assert [(p.name, p.kind, p.binding, p.passed) for p in f.parameters] == [
        ("input_ids", pb.Parameter.TENSOR, pb.Parameter.POSITIONAL_OR_KEYWORD, True),
        ("attention_mask", pb.Parameter.OPTIONAL_TENSOR, pb.Parameter.POSITIONAL_OR_KEYWORD, True),
        ("scale", pb.Parameter.FLOAT, pb.Parameter.KEYWORD_ONLY, False),
        # An entry of **kwargs the second call passed: absent (None) by default.
        ("bias", pb.Parameter.TENSOR, pb.Parameter.VAR_KEYWORD, True),
    ]
    assert f.parameters[3].default_value.none
    # input_ids index the embedding's 50 rows.
    assert f.parameters[0].HasField("index_range")
    assert (f.parameters[0].index_range.min, f.parameters[0].index_range.max) == (0, 50)
    assert not f.parameters[1].HasField("index_range")


def test_which_optional_arguments_were_given_is_guarded(keyword_capture):
    cap, path = keyword_capture
    first, second = frame_proto(read_manifest(path), "forward").variants
    # The first variant was captured before `bias` was seen: it requires it absent.
    guards = {g.parameter: g for g in first.guards}
    assert guards[1].tensor.is_none and guards[3].tensor.is_none
    assert guards[2].equals.float_value == 1.0
    guards = {g.parameter: g for g in second.guards}
    assert not guards[1].tensor.is_none and guards[3].tensor.dtype == pb.DTYPE_FLOAT32
    assert list(second.tensor_inputs) == [0, 1, 3]
    rows = cap.frames_text().splitlines()
    assert "  forward#0: input_ids: int64[2, 5], attention_mask is None, scale == 1.0, bias is None" in rows


def test_outputs_are_named_by_their_path(keyword_capture):
    cap, path = keyword_capture
    f = frame_proto(read_manifest(path), "forward")
    assert [(leaf.name, leaf.is_tensor, leaf.python_type) for leaf in f.outputs.leaves] == [
        ("hidden", True, ""),
        ("pooled.0", True, ""),
        ("pooled.1", False, "NoneType"),
        ("count", False, "int"),
    ]
    assert f.outputs.tree_spec == "dict(*, tuple(*, *), *)"
    # A compiled variant returns a value for every leaf; the tensors are served.
    assert [v.num_outputs for v in f.variants] == [4, 4]
    assert [len(v.outputs) for v in f.variants] == [2, 2]
    assert cap.frame("forward").outputs == ("hidden", "pooled.0")
    assert "  returns [hidden, pooled.0, pooled.1 (NoneType, not served), count (int, not served)]" in (
        cap.frames_text().splitlines()
    )


def test_unflagged_frames_carry_no_eager_program(keyword_capture):
    _, path = keyword_capture
    f = frame_proto(read_manifest(path), "forward")
    assert not f.eager_fallback and f.eager_program_path == ""
    assert sorted(os.listdir(os.path.join(path, "frames", "forward"))) == ["0.pt2", "1.pt2"]


@dataclasses.dataclass
class Pair:
    first: torch.Tensor
    second: Optional[torch.Tensor]


def test_a_dataclass_output_is_a_pytree(tmp_path):
    class Model(torch.nn.Module):
        def forward(self, x):
            return Pair(x + 1, None), x * 2

    cap = precompile_capture.capture(Model(), name="dc", decline=skip_every_graph)
    cap(torch.randn(2))
    with pytest.raises(PrecompileError, match="fell back to eager on its first call"):
        cap.save(tmp_path / "dc")
    assert cap.frame("forward").outputs == ("output0.first", "output1")


def _use_cache_from_config(forward):
    """As transformers' merge_with_config_defaults: a default taken from the
    config goes in as a keyword where no keyword names the parameter."""

    @functools.wraps(forward)
    def wrapper(self, *args, **kwargs):
        if kwargs.get("use_cache") is None:
            kwargs["use_cache"] = True
        return forward(self, *args, **kwargs)

    return wrapper


def test_the_exported_frame_is_called_with_keywords_as_its_callers_call_it():
    # Given use_cache positionally as well, the decorated forward is a call
    # Python refuses but Dynamo traces, putting the second value in **kwargs:
    # the exported program then took the branch the eager call never takes.
    class Model(torch.nn.Module):
        @_use_cache_from_config
        def forward(self, x, use_cache=None, **kwargs):
            return x * 2 if use_cache else x + 1000

    programs = []

    def keep(ep):
        programs.append(ep)
        skip_every_graph(ep)

    cap = precompile_capture.capture(Model(), name="uc", decline=keep)
    x = torch.ones(2)
    assert torch.equal(cap(x), x * 2)
    assert torch.equal(programs[0].module()(x, None), x * 2)  # the frame's inputs: x, use_cache


def test_a_call_that_does_not_match_the_signature_names_the_frame():
    cap = precompile_capture.capture(KeywordModel(), name="kw")
    with pytest.raises(PrecompileError, match=r"frame 'forward': the call does not match its signature"):
        cap(torch.zeros(1, 2, dtype=torch.long), torch.ones(1, 2), 2.0)  # scale is keyword-only


def test_args_must_keep_their_count():
    def total(*tensors):
        return sum(tensors)

    cap = precompile_capture.capture(total, name="total", decline=skip_every_graph)
    x = torch.ones(2)
    cap(x, x)
    assert cap.frame("total").parameters == (("tensors.0", "TENSOR"), ("tensors.1", "TENSOR"))
    with pytest.raises(PrecompileError, match=r"passes 3 values through \*tensors, an earlier one 2"):
        cap(x, x, x)


class FakeCache:
    def __init__(self, t):
        self.t = t


def test_an_output_the_server_cannot_send_is_named_at_the_call():
    class Model(torch.nn.Module):
        def forward(self, x):
            return {"hidden": x + 1, "past_key_values": FakeCache(x)}

    cap = precompile_capture.capture(Model(), name="m")
    with pytest.raises(PrecompileError) as e:
        cap(torch.randn(2))
    assert "frame 'forward' returns a FakeCache at 'past_key_values'" in str(e.value)
    assert "register_pytree_node" in str(e.value)


class LayeredCache:
    """A cache whose library's flatten refuses some of its layers, as
    transformers' DynamicCache refuses Mamba's."""

    def __init__(self, t):
        self.t = t


def _refuse_to_flatten(cache):
    raise RuntimeError("This pytree flattening function should be applied to LayeredCache "
                       "containing only key/value layers")


torch.utils._pytree.register_pytree_node(LayeredCache, _refuse_to_flatten,
                                         lambda children, context: LayeredCache(*children))


def test_an_output_its_library_cannot_take_apart_is_named_at_the_call():
    class Model(torch.nn.Module):
        def forward(self, x):
            return {"logits": x + 1, "cache_params": LayeredCache(x)}

    cap = precompile_capture.capture(Model(), name="m")
    with pytest.raises(PrecompileError) as e:
        cap(torch.randn(2))
    message = str(e.value)
    assert ("frame 'forward' returns a LayeredCache at 'cache_params' that its library cannot take "
            "apart into tensors (RuntimeError: This pytree flattening function") in message, message
    assert "use_cache=False" in message


def test_outputs_must_keep_their_structure():
    class Model(torch.nn.Module):
        def forward(self, x: torch.Tensor, n: int) -> list:
            return [x * i for i in range(n)]

    cap = precompile_capture.capture(Model(), name="m", decline=skip_every_graph)
    cap(torch.randn(2), 1)
    with pytest.raises(PrecompileError) as e:
        cap(torch.randn(2), 2)
    message = str(e.value)
    assert "frame 'forward' returned [output0, output1] as list(*, *)" in message
    assert "an earlier call returned [output0] as list(*)" in message


class KwargsLoop(torch.nn.Module):
    def forward(self, x: torch.Tensor, n: int = 0, **kwargs) -> torch.Tensor:
        for _ in range(n):
            x = opaque(x)
        return x


def as_dict(y: torch.Tensor):
    return {"y": y + 1.0}


def total(*tensors):
    return sum(tensors)


class CallsAsDict(torch.nn.Module):
    """Breaks the graph in a loop (flagged), then calls the frame as_dict."""

    def forward(self, x: torch.Tensor):
        for _ in range(2):
            x = opaque(x)
        return as_dict(x)


def test_a_flagged_frame_that_calls_a_frame_returning_a_dict_gets_python_not_torchscript():
    cap = precompile_capture.capture(Calls(CallsAsDict()), name="m", frames=["inner", as_dict],
                                     eager="torchscript")
    with pytest.raises(PrecompileError) as e:
        cap(torch.randn(2))
    assert "frame 'inner' calls captured frame 'as_dict', but its TorchScript eager program cannot" in str(e.value)
    # Its Python eager program calls as_dict through the runtime and rebuilds the dict.
    cap = precompile_capture.capture(Calls(CallsAsDict()), name="m", frames=["inner", as_dict])
    cap(torch.randn(2))
    [inner] = [line for line in cap.frames_text().splitlines() if line.startswith("inner:")]
    assert inner.endswith("# eager program: Python"), inner


def test_a_frame_torchscript_cannot_express_does_not_stop_another_from_being_scripted():
    from models_for_tests import Loop

    # total takes *tensors (no TorchScript stub can call it); inner never does.
    cap = precompile_capture.capture(Calls(Loop(), 2), name="m", frames=["inner", total])
    cap(torch.randn(8, 4))
    assert cap.frame("inner").eager_fallback


def test_a_flagged_frame_torchscript_cannot_express_is_refused_at_the_call():
    cap = precompile_capture.capture(Calls(KwargsLoop(), 2), name="outer", frames=["inner"], eager="torchscript")
    with pytest.raises(PrecompileError) as e:
        # The entry breaks inside inner's loop and runs eagerly; inner breaks
        # too and is flagged, and it takes **kwargs.
        cap(torch.randn(2))
    message = str(e.value)
    assert "frame 'inner' cannot be scripted for its eager program" in message
    assert "**kwargs, which TorchScript cannot express" in message
    assert "Frame 'inner' is flagged eager_fallback (GRAPH_BREAK" in message
    assert 'Ways out: capture with eager="python"' in message
    assert "capture the parts Dynamo compiles as frames of their own" in message
    # Nothing was compiled: each frame traced twice, the second time after
    # one eager run.
    assert cap.export_count == 4


def test_the_server_takes_keywords_and_sends_outputs_by_path(keyword_capture, tmp_path):
    """The saved artifact through the real server (bazel build //server:precompile_server)."""
    import grpc
    import numpy as np
    from proto import inference_pb2, inference_pb2_grpc
    from server_process import ServerProcess, copy_tree

    _, path = keyword_capture
    copy_tree(pathlib.Path(path), tmp_path / "kw" / "1")
    server = ServerProcess(BIN / "server" / "precompile_server", tmp_path)

    def infer(inputs, outputs=(), parameters=None):
        request = inference_pb2.ModelInferRequest(model_name="kw")
        for name, array in inputs.items():
            request.inputs.add(name=name, datatype={"int64": "INT64", "float32": "FP32"}[str(array.dtype)],
                               shape=list(array.shape))
            request.raw_input_contents.append(array.tobytes())
        for name in outputs:
            request.outputs.add(name=name)
        for name, value in (parameters or {}).items():
            request.parameters[name].double_param = value
        response = stub.ModelInfer(request, timeout=30)
        return response.parameters["precompile_variant"].string_param, [o.name for o in response.outputs]

    try:
        with grpc.insecure_channel(server.address) as channel:
            stub = inference_pb2_grpc.GRPCInferenceServiceStub(channel)
            ids = np.zeros((2, 5), np.int64)
            assert infer({"input_ids": ids}) == ("forward#0", ["hidden", "pooled.0"])
            # An entry of **kwargs is an input like any other.
            got = infer({"input_ids": ids, "attention_mask": np.ones((2, 5), np.float32),
                         "bias": np.ones(4, np.float32)}, ["pooled.0"])
            assert got == ("forward#1", ["pooled.0"])
            with pytest.raises(grpc.RpcError) as e:
                infer({"input_ids": ids}, ["count"])
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "output 'count' of model 'kw' is not a tensor (int): only tensors are sent" in e.value.details()
            with pytest.raises(grpc.RpcError) as e:
                infer({"input_ids": np.array([[3, -1]], np.int64)})
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "argument 'input_ids' holds -1 at flat index 1" in e.value.details()
            with pytest.raises(grpc.RpcError) as e:
                infer({"input_ids": ids}, parameters={"scale": 2.0})
            assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "scale: expected 1, got 2" in e.value.details()
    finally:
        assert server.stop() == 0, server.log()
