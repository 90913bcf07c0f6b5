"""Request traces in Triton's shape, through Triton's own client.

The real server serves the examples with --trace_file; tritonclient (HTTP) and
the generated gRPC stubs (Triton's messages; tritonclient.grpc cannot share a
process with this project's protos) read and change the trace settings
(changes need the admin token, the
trace file is the server's alone), then single requests are traced: a variant
hit over gRPC and an eager miss over HTTP. Their timestamps must be in order
and add up to what ModelStatistics recorded for the same request, and their
frame calls must name what served them.
"""

import json
import pathlib
import sys

import grpc as grpc_lib
import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from proto import inference_pb2, inference_pb2_grpc

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "testing"))
from server_process import ServerProcess, built, copy_tree  # noqa: E402

BIN = ROOT / "bazel-bin"
TOKEN = "trace-admin-token"
AUTHORIZED = {"Authorization": f"Bearer {TOKEN}"}
HIT = ["REQUEST_START", "QUEUE_START", "COMPUTE_START", "COMPUTE_INPUT_END",
       "COMPUTE_OUTPUT_START", "COMPUTE_END", "REQUEST_END"]
EAGER = HIT[:4] + ["EAGER_QUEUE_START", "EAGER_START"] + HIT[4:]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("traces")
    for name in ("mlp", "loop"):
        copy_tree(built(BIN / "examples" / name), root / "repository" / name / "1")
    token = root / "token"
    token.write_text(TOKEN + "\n")
    token.chmod(0o600)
    process = ServerProcess(built(BIN / "server" / "precompile_server"), root / "repository",
                            [f"--trace_file={root / 'trace.json'}", f"--admin_token_file={token}"])
    process.trace_file = root / "trace.json"
    yield process
    assert process.stop() == 0, process.log()
    # Stopped, the file is a whole JSON array (once a test has traced).
    if process.trace_file.exists():
        assert isinstance(json.loads(process.trace_file.read_text()), list)


@pytest.fixture
def http(server):
    client = httpclient.InferenceServerClient(server.http_address)
    yield client
    client.close()


@pytest.fixture
def grpc(server):
    with grpc_lib.insecure_channel(server.address) as channel:
        yield inference_pb2_grpc.GRPCInferenceServiceStub(channel)


def trace_setting(stub, model="", metadata=(), **settings):
    """The TraceSetting RPC: settings name -> list of values, or None to clear."""
    request = inference_pb2.TraceSettingRequest(model_name=model)
    for name, values in settings.items():
        request.settings[name].value.extend(values or [])
    answer = stub.TraceSetting(request, metadata=metadata, timeout=10)
    return {name: list(v.value) for name, v in answer.settings.items()}


def traces(path: pathlib.Path) -> dict:
    """id -> the trace's objects merged. A file still written lacks its ']'."""
    text = path.read_text().rstrip() if path.exists() else "["
    if not text.endswith("]"):
        text += "\n]"
    merged = {}
    for obj in json.loads(text):
        merged.setdefault(obj["id"], {}).update(obj)
    return merged


def stats(http, model) -> dict:
    s = http.get_inference_statistics(model)["model_stats"][0]["inference_stats"]
    return {k: s[k]["ns"] for k in ("queue", "compute_input", "compute_infer", "compute_output")}


def ns(trace) -> dict:
    return {t["name"]: t["ns"] for t in trace["timestamps"]}


def test_settings_are_triton_s_and_only_the_admin_token_changes_them(server, http, grpc):
    settings = http.get_trace_settings()
    assert settings == {"trace_level": ["OFF"], "trace_rate": "1000", "trace_count": "-1",
                        "log_frequency": "0", "trace_file": str(server.trace_file)}
    with pytest.raises(InferenceServerException) as refused:
        http.update_trace_settings(settings={"trace_level": ["TIMESTAMPS"]})
    assert refused.value.status() == "401" or "401" in str(refused.value)
    with pytest.raises(grpc_lib.RpcError) as refused:
        trace_setting(grpc, trace_rate=["5"])
    assert refused.value.code() == grpc_lib.StatusCode.UNAUTHENTICATED
    assert http.get_trace_settings()["trace_level"] == ["OFF"]

    # A model's own settings override the server's and clear back to them.
    changed = http.update_trace_settings("mlp", {"trace_rate": "7"}, headers=AUTHORIZED)
    assert changed["trace_rate"] == "7" and changed["trace_level"] == ["OFF"]
    assert trace_setting(grpc, "mlp")["trace_rate"] == ["7"]
    assert http.get_trace_settings()["trace_rate"] == "1000"
    cleared = trace_setting(grpc, "mlp", metadata=(("authorization", f"Bearer {TOKEN}"),),
                            trace_rate=None)
    assert cleared["trace_rate"] == ["1000"]

    # What it cannot do is refused, naming the setting, and changes nothing.
    for bad, words in ((dict(trace_file="/etc/cron.d/x"), "--trace_file"),
                       (dict(trace_level=["TENSORS"]), "TENSORS"),
                       (dict(trace_rate="-3"), "trace_rate")):
        with pytest.raises(InferenceServerException) as refused:
            http.update_trace_settings(settings=bad, headers=AUTHORIZED)
        assert words in refused.value.message()
    with pytest.raises(InferenceServerException) as refused:
        http.update_trace_settings("no_such_model", {"trace_rate": "1"}, headers=AUTHORIZED)
    assert "no_such_model" in refused.value.message()
    assert http.get_trace_settings() == settings


def test_a_variant_hit_s_trace_adds_up_to_its_statistics(server, http, grpc):
    before = stats(http, "mlp")
    known = set(traces(server.trace_file))
    http.update_trace_settings("mlp", {"trace_level": ["TIMESTAMPS"], "trace_rate": "1",
                                       "trace_count": "1"}, headers=AUTHORIZED)
    def infer(request_id):
        request = inference_pb2.ModelInferRequest(model_name="mlp", id=request_id)
        request.inputs.add(name="x", datatype="FP32", shape=[8, 4])
        request.raw_input_contents.append(np.ones((8, 4), np.float32).tobytes())
        return grpc.ModelInfer(request, timeout=10)

    result = infer("traced-hit")
    after = stats(http, "mlp")
    # The count ran out: the next request is not traced.
    assert http.get_trace_settings("mlp")["trace_count"] == "0"
    infer("not-traced")

    new = [t for i, t in traces(server.trace_file).items() if i not in known]
    assert [t["request_id"] for t in new] == ["traced-hit"]
    trace = new[0]
    assert trace["model_name"] == "mlp" and trace["model_version"] == 1
    assert trace["outcome"] == "variant"
    assert [t["name"] for t in trace["timestamps"]] == HIT
    t = ns(trace)
    assert all(a <= b for a, b in zip(list(t.values()), list(t.values())[1:])), t
    # One request: its statistics are its trace's phases (to the
    # microsecond: both come from the same clock readings).
    phases = {"queue": t["COMPUTE_START"] - t["QUEUE_START"],
              "compute_input": t["COMPUTE_INPUT_END"] - t["COMPUTE_START"],
              "compute_infer": t["COMPUTE_OUTPUT_START"] - t["COMPUTE_INPUT_END"],
              "compute_output": t["COMPUTE_END"] - t["COMPUTE_OUTPUT_START"]}
    for phase, took in phases.items():
        assert abs((after[phase] - before[phase]) - took) <= 1000, (phase, took, after, before)
    [frame] = trace["frames"]
    variant = result.parameters["precompile_variant"].string_param
    assert frame == {**frame, "frame": "forward", "entry": True, "outcome": "variant",
                     "variant": variant}
    assert 0 < frame["guards_ns"] and 0 < frame["run_ns"]
    assert frame["guards_ns"] + frame["run_ns"] <= phases["compute_infer"]


def test_an_eager_miss_s_trace_shows_its_wait_for_an_eager_thread(server, http):
    before = stats(http, "loop")
    known = set(traces(server.trace_file))
    http.update_trace_settings("loop", {"trace_level": ["TIMESTAMPS"], "trace_rate": "1",
                                        "trace_count": "1"}, headers=AUTHORIZED)
    x = httpclient.InferInput("x", [8, 4], "FP32")
    x.set_data_from_numpy(np.full((8, 4), 0.5, np.float32))
    result = http.infer("loop", [x], parameters={"n": 2}, request_id="traced-miss")
    assert result.get_response()["parameters"]["precompile_outcome"] == "eager_fallback"
    after = stats(http, "loop")

    [trace] = [t for i, t in traces(server.trace_file).items() if i not in known]
    assert trace["request_id"] == "traced-miss" and trace["outcome"] == "eager_fallback"
    assert [t["name"] for t in trace["timestamps"]] == EAGER
    t = ns(trace)
    values = list(t.values())
    assert all(a <= b for a, b in zip(values, values[1:])), t
    # One request: its statistics are its trace's phases, the wait for an
    # eager thread counted as queueing.
    phases = {"queue": (t["COMPUTE_START"] - t["QUEUE_START"])
                       + (t["EAGER_START"] - t["EAGER_QUEUE_START"]),
              "compute_input": t["COMPUTE_INPUT_END"] - t["COMPUTE_START"],
              "compute_infer": (t["EAGER_QUEUE_START"] - t["COMPUTE_INPUT_END"])
                               + (t["COMPUTE_OUTPUT_START"] - t["EAGER_START"]),
              "compute_output": t["COMPUTE_END"] - t["COMPUTE_OUTPUT_START"]}
    for phase, took in phases.items():
        assert abs((after[phase] - before[phase]) - took) <= 1000, (phase, took, after, before)
    [frame] = trace["frames"]
    assert frame["frame"] == "forward" and frame["entry"] and frame["outcome"] == "eager_fallback"
    assert frame["variant"] == ""
    assert frame["guards_ns"] + frame["run_ns"] <= t["COMPUTE_OUTPUT_START"] - t["EAGER_START"]
