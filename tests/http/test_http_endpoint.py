"""The KServe v2 HTTP/REST endpoint of the real server binary, with real
clients: Triton's tritonclient.http, curl, and raw sockets for what a client
library would never send. Answers are compared with the gRPC endpoint's for
the same tensors, through the project's generated stubs (tritonclient.grpc
registers the same proto names, so the two cannot share a process).

Needs the Bazel build outputs: bazel build //server:precompile_server
//examples:artifacts. Runs with the project's environment:
.venv/bin/python -m pytest tests/http
"""

import json
import pathlib
import socket
import ssl
import subprocess
import sys
import time
from http.client import HTTPSConnection

import grpc as grpclib
import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from proto import inference_pb2, inference_pb2_grpc

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "testing"))
from server_process import ServerProcess, built, copy_tree  # noqa: E402
BIN = ROOT / "bazel-bin"
MAX_BODY = 1 << 20  # --max_message_bytes of the test server.
TOKEN = "http-test-token"


def _repository(root: pathlib.Path, models=("mlp", "loop", "dtypes", "passthrough")):
    for name in models:
        copy_tree(built(BIN / "examples" / name), root / name / "1")
    return root


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("http")
    token = root / "token"
    token.write_text(TOKEN + "\n")
    token.chmod(0o600)
    process = ServerProcess(
        built(BIN / "server" / "precompile_server"), _repository(root / "repository"),
        [f"--max_message_bytes={MAX_BODY}", "--http_request_timeout_seconds=2",
         f"--admin_token_file={token}"])
    yield process
    assert process.stop() == 0, process.log()


@pytest.fixture
def http(server):
    client = httpclient.InferenceServerClient(server.http_address)
    yield client
    client.close()


class GrpcClient:
    """The server's gRPC endpoint through the generated stubs."""

    def __init__(self, address):
        self.channel = grpclib.insecure_channel(address)
        self.stub = inference_pb2_grpc.GRPCInferenceServiceStub(self.channel)

    def infer(self, model, tensors, parameters=None):
        """Output bytes by name, for `tensors`: (name, datatype, shape, raw bytes)."""
        request = inference_pb2.ModelInferRequest(model_name=model)
        for name, datatype, shape, raw in tensors:
            request.inputs.add(name=name, datatype=datatype, shape=list(shape))
            request.raw_input_contents.append(raw)
        for key, value in (parameters or {}).items():
            request.parameters[key].int64_param = value
        response = self.stub.ModelInfer(request, timeout=30)
        return {o.name: raw for o, raw in zip(response.outputs, response.raw_output_contents)}


@pytest.fixture
def grpc(server):
    client = GrpcClient(server.address)
    yield client
    client.channel.close()


def curl(server, *args, path="/v2", data=None, headers=()):
    """(status, headers, body) of one curl request to the server's HTTP port."""
    command = ["curl", "-sS", "-i", "--max-time", "20"]
    for h in headers:
        command += ["-H", h]
    if data is not None:
        command += ["--data-binary", "@-"]
    command += [*args, f"http://{server.http_address}{path}"]
    done = subprocess.run(command, input=data if isinstance(data, bytes) else
                          (data.encode() if data is not None else None),
                          capture_output=True, check=True)
    head, _, body = done.stdout.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    status = int(lines[0].split()[1])
    fields = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    return status, fields, body


def raw_http(server, request: bytes, half_close=False, timeout=10.0) -> bytes:
    """What the server answers to `request` bytes, read until it closes or
    `timeout` passes."""
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=timeout) as s:
        s.sendall(request)
        if half_close:
            s.shutdown(socket.SHUT_WR)
        answer = b""
        try:
            while chunk := s.recv(65536):
                answer += chunk
                if b"\r\n\r\n" in answer:
                    head, _, body = answer.partition(b"\r\n\r\n")
                    length = [int(line.split(b":")[1]) for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length:")]
                    if length and len(body) >= length[0]:
                        break
        except socket.timeout:
            pass
        return answer


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


def body_of(answer: bytes) -> dict:
    return json.loads(answer.partition(b"\r\n\r\n")[2])


def mlp_request(batch=8, binary=True):
    x = np.random.default_rng(batch).standard_normal((batch, 4), dtype=np.float32)
    tensor = httpclient.InferInput("x", [batch, 4], "FP32")
    tensor.set_data_from_numpy(x, binary_data=binary)
    return x, [tensor]


def still_serving(http):
    """The server answers a good request after whatever came before."""
    _, inputs = mlp_request()
    assert http.infer("mlp", inputs).as_numpy("output0").shape == (8, 3)


def still_serving_a_new_connection(server):
    """still_serving from a client of its own: a kept-alive connection left
    idle past --http_request_timeout_seconds is closed by the server, and
    Triton's client does not send a POST again on a fresh one."""
    client = httpclient.InferenceServerClient(server.http_address)
    try:
        still_serving(client)
    finally:
        client.close()


# --- Every endpoint, through Triton's HTTP client, against gRPC's answers.

def test_health_metadata_config_index_and_stats_answer_as_grpc_does(http, grpc):
    assert http.is_server_live() and http.is_server_ready()
    assert http.is_model_ready("mlp") and http.is_model_ready("mlp", "1")
    assert not http.is_model_ready("mlp", "7")
    assert not http.is_model_ready("nosuch")

    server = http.get_server_metadata()
    assert server["name"] == "precompile-serve"
    assert "binary_tensor_data" in server["extensions"]
    by_grpc = grpc.stub.ServerMetadata(inference_pb2.ServerMetadataRequest(), timeout=10)
    assert server == {"name": by_grpc.name, "version": by_grpc.version,
                      "extensions": list(by_grpc.extensions)}

    def tensors(metadata):
        return [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in metadata]

    for name in ("mlp", "dtypes", "loop"):
        by_grpc = grpc.stub.ModelMetadata(inference_pb2.ModelMetadataRequest(name=name), timeout=10)
        assert http.get_model_metadata(name) == {
            "name": by_grpc.name, "versions": list(by_grpc.versions), "platform": by_grpc.platform,
            "inputs": tensors(by_grpc.inputs), "outputs": tensors(by_grpc.outputs)}
    meta = http.get_model_metadata("mlp", "1")
    assert meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}]

    config = http.get_model_config("mlp")
    # Triton's HTTP answer is the configuration itself, with numbers as numbers.
    assert config["name"] == "mlp" and config["input"][0]["dims"] == [-1, 4]
    assert config["parameters"]["entry_frame"] == {"string_value": "forward"}
    assert config["version_policy"] == {"latest": {"num_versions": 1}}

    index = http.get_model_repository_index()
    assert sorted(m["name"] for m in index) == ["dtypes", "loop", "mlp", "passthrough"]
    assert all(m["state"] == "READY" and m["version"] == "1" for m in index)

    _, inputs = mlp_request()
    http.infer("mlp", inputs)
    stats = http.get_inference_statistics("mlp")["model_stats"]
    assert [s["name"] for s in stats] == ["mlp"]
    assert stats[0]["inference_count"] >= 1
    assert isinstance(stats[0]["inference_stats"]["success"]["ns"], int)
    everything = http.get_inference_statistics()["model_stats"]
    assert {s["name"] for s in everything} == {"dtypes", "loop", "mlp", "passthrough"}


def test_infer_answers_the_same_tensors_as_grpc_in_json_and_binary(http, grpc):
    x, inputs = mlp_request(8, binary=True)
    by_http = http.infer("mlp", inputs, outputs=[httpclient.InferRequestedOutput("output0",
                                                                                  binary_data=True)])
    by_grpc = grpc.infer("mlp", [("x", "FP32", x.shape, x.tobytes())])["output0"]
    assert by_http.as_numpy("output0").tobytes() == by_grpc
    assert by_http.get_response()["parameters"] == {"precompile_outcome": "variant",
                                                    "precompile_variant": "forward#0"}

    # JSON both ways: the printed floats read back as the same float32 values.
    _, json_inputs = mlp_request(8, binary=False)
    by_json = http.infer("mlp", json_inputs,
                         outputs=[httpclient.InferRequestedOutput("output0", binary_data=False)])
    assert by_json.as_numpy("output0").tobytes() == by_grpc


def test_large_outputs_come_back_whole_in_binary_and_json(http):
    # passthrough's outputs (16, 8 and 16 KiB) are large enough to be sent
    # from the tensors themselves, the first two after copying them out of
    # the request they share memory with.
    x = np.random.default_rng(3).standard_normal((1024, 4), dtype=np.float32)
    tensor = httpclient.InferInput("x", [1024, 4], "FP32")
    tensor.set_data_from_numpy(x, binary_data=True)
    asked = [httpclient.InferRequestedOutput("output0", binary_data=True),
             httpclient.InferRequestedOutput("output1", binary_data=False),
             httpclient.InferRequestedOutput("output2", binary_data=True)]
    for _ in range(3):
        result = http.infer("passthrough", [tensor], outputs=asked)
        assert result.as_numpy("output0").tobytes() == x.tobytes()
        assert result.as_numpy("output1").tobytes() == x[:512].tobytes()
        assert result.as_numpy("output2").tobytes() == (x * 2).tobytes()


def test_every_datatype_round_trips_as_grpc_does(http, grpc):
    rng = np.random.default_rng(5)
    arrays = {
        "f16": rng.standard_normal((2, 3)).astype(np.float16),
        "f32": rng.standard_normal((2, 3)).astype(np.float32),
        "f64": rng.standard_normal((2, 3)),
        "u8": rng.integers(0, 250, (2, 3), dtype=np.uint8),
        "i8": rng.integers(-100, 100, (2, 3), dtype=np.int8),
        "i16": rng.integers(-1000, 1000, (2, 3), dtype=np.int16),
        "i32": rng.integers(-10**6, 10**6, (2, 3), dtype=np.int32),
        "i64": rng.integers(-2**40, 2**40, (2, 3), dtype=np.int64),
        "b": rng.integers(0, 2, (2, 3)).astype(bool),
    }
    bf16_bits = (rng.standard_normal((2, 3)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    datatypes = {"f16": "FP16", "f32": "FP32", "f64": "FP64", "u8": "UINT8", "i8": "INT8",
                 "i16": "INT16", "i32": "INT32", "i64": "INT64", "b": "BOOL"}

    def inputs(binary):
        tensors = []
        for name, array in arrays.items():
            t = httpclient.InferInput(name, [2, 3], datatypes[name])
            t.set_data_from_numpy(array, binary_data=binary)
            tensors.append(t)
        # numpy has no bfloat16: its bytes go as binary data.
        t = httpclient.InferInput("bf16", [2, 3], "BF16")
        t._parameters["binary_data_size"] = bf16_bits.nbytes
        t._raw_data = bf16_bits.tobytes()
        return tensors + [t]

    outputs = [f"output{i}" for i in range(10)]
    expected = grpc.infer("dtypes", [(n, datatypes[n], a.shape, a.tobytes()) for n, a in arrays.items()]
                          + [("bf16", "BF16", (2, 3), bf16_bits.tobytes())])
    binary = http.infer("dtypes", inputs(True),
                        outputs=[httpclient.InferRequestedOutput(o, binary_data=True) for o in outputs])
    for o in outputs:
        if o == "output1":
            continue  # BF16: tritonclient cannot read it back; compared as JSON below.
        assert binary.as_numpy(o).tobytes() == expected[o], o

    # JSON both ways (BF16's input still binary): the same values. FP16 and
    # BF16 print with the digits that read back the same 16-bit value.
    as_json = http.infer("dtypes", inputs(False),
                         outputs=[httpclient.InferRequestedOutput(o, binary_data=False) for o in outputs])
    response = as_json.get_response()
    by_name = {o["name"]: o for o in response["outputs"]}
    for o in outputs:
        data = by_name[o]["data"]
        if o == "output1":
            # The printed digits read back to the nearest bfloat16.
            words = np.array(data, dtype=np.float32).view(np.uint32)
            bits = ((words + 0x7FFF + ((words >> 16) & 1)) >> 16).astype(np.uint16)
            assert bits.tobytes() == expected[o]
        else:
            assert as_json.as_numpy(o).tobytes() == expected[o], o


def test_each_response_says_how_it_was_served(http):
    x = np.ones((8, 4), dtype=np.float32)  # The shape loop was captured at.
    t = httpclient.InferInput("x", [8, 4], "FP32")
    t.set_data_from_numpy(x)
    eager = http.infer("loop", [t], parameters={"n": 1}).get_response()
    assert eager["parameters"]["precompile_outcome"] == "eager_fallback"
    compiled = http.infer("loop", [t], parameters={"n": 0}).get_response()
    assert compiled["parameters"]["precompile_outcome"] == "variant"


def test_errors_have_the_grpc_message_and_the_matching_http_status(http, grpc):
    _, inputs = mlp_request(1)
    with pytest.raises(InferenceServerException) as by_http:
        http.infer("mlp", inputs)
    with pytest.raises(grpclib.RpcError) as by_grpc:
        grpc.infer("mlp", [("x", "FP32", (1, 4), np.zeros((1, 4), np.float32).tobytes())])
    assert by_http.value.status() == "400"
    assert by_grpc.value.code() == grpclib.StatusCode.FAILED_PRECONDITION
    assert by_http.value.message() == by_grpc.value.details()
    assert "no captured variant matches this call of frame 'forward'" in by_http.value.message()

    with pytest.raises(InferenceServerException) as unknown:
        http.infer("nosuch", inputs)
    assert unknown.value.status() == "404"
    assert "nosuch" in unknown.value.message()
    with pytest.raises(InferenceServerException) as version:
        http.get_model_metadata("mlp", "7")
    assert version.value.status() == "404"
    still_serving(http)


# --- curl and raw sockets: what clients get wrong.

def test_curl_gets_kserve_error_bodies_for_bad_requests(server, http):
    infer = "/v2/models/mlp/infer"
    cases = [
        ("{", "invalid JSON"),
        ('{"inputs": [{"name": "x", "shape": [2, 4], "datatype": "FP32", "data": [1, 2]}]}',
         "has 2 values but shape [2, 4] needs 8"),
        ('{"inputs": [{"name": "y", "shape": [1], "datatype": "FP32", "data": [1]}]}',
         "model 'mlp' has no input 'y' (its inputs: x)"),
        ('{"inputs": [{"name": "x", "shape": [1], "datatype": "INT8", "data": [999]}]}',
         "does not fit INT8"),
        ('{"inputs": [], "bogus": 1}', 'unknown member "bogus"'),
    ]
    for body, message in cases:
        status, headers, answer = curl(server, path=infer, data=body)
        assert status == 400, answer
        assert headers["content-type"] == "application/json"
        assert message in json.loads(answer)["error"], answer
    status, _, answer = curl(server, path="/v2/models/nosuch/infer", data='{"inputs": []}')
    assert status == 404 and "unknown model 'nosuch'" in json.loads(answer)["error"]
    status, _, answer = curl(server, path="/v2/nowhere")
    assert status == 404 and "no such path" in json.loads(answer)["error"]
    status, _, answer = curl(server, "-X", "GET", path=infer)
    assert status == 405 and "takes POST" in json.loads(answer)["error"]
    status, _, answer = curl(server, path=infer, data="{}",
                             headers=["Content-Encoding: gzip"])
    assert status == 415
    still_serving(http)


def test_curl_reads_health_and_binary_inference(server):
    assert curl(server, path="/v2/health/live")[0] == 200
    assert curl(server, path="/v2/health/ready")[0] == 200
    assert curl(server, path="/v2/models/mlp/versions/1/ready")[0] == 200
    assert curl(server, path="/v2/models/mlp/versions/9/ready")[0] == 400

    x = np.arange(32, dtype=np.float32).reshape(8, 4)
    header = json.dumps({"inputs": [{"name": "x", "shape": [8, 4], "datatype": "FP32",
                                     "parameters": {"binary_data_size": x.nbytes}}],
                         "parameters": {"binary_data_output": True}}).encode()
    status, headers, body = curl(server, path="/v2/models/mlp/infer", data=header + x.tobytes(),
                                 headers=[f"Inference-Header-Content-Length: {len(header)}",
                                          "Content-Type: application/octet-stream"])
    assert status == 200, body
    json_length = int(headers["inference-header-content-length"])
    meta = json.loads(body[:json_length])
    assert meta["outputs"][0]["parameters"] == {"binary_data_size": 8 * 3 * 4}
    assert len(body) == json_length + 8 * 3 * 4


def test_a_body_labelled_as_a_form_is_read_as_json_whatever_its_size(server):
    # curl -d (and --data-binary) label a body application/x-www-form-urlencoded;
    # a server that parses such bodies as forms refuses them, or mangles them.
    x = np.arange(512 * 4, dtype=np.float32).reshape(512, 4) / 100
    body = json.dumps({"inputs": [{"name": "x", "shape": [512, 4], "datatype": "FP32",
                                   "data": x.ravel().tolist()}]})
    assert len(body) > 8192
    status, _, answer = curl(server, path="/v2/models/mlp/infer", data=body)
    assert status == 200, answer
    assert json.loads(answer)["outputs"][0]["shape"] == [512, 3]


def test_lying_sizes_are_refused_and_change_nothing(server, http):
    header = json.dumps({"inputs": [{"name": "x", "shape": [8, 4], "datatype": "FP32",
                                     "parameters": {"binary_data_size": 128}}]}).encode()
    data = np.zeros((8, 4), dtype=np.float32).tobytes()
    # The header length says more than the body holds.
    status, _, answer = curl(server, path="/v2/models/mlp/infer", data=header + data,
                             headers=[f"Inference-Header-Content-Length: {len(header) + 500}"])
    assert status == 400 and "Inference-Header-Content-Length header says" in json.loads(answer)["error"]
    # The binary data is shorter than binary_data_size.
    status, _, answer = curl(server, path="/v2/models/mlp/infer", data=header + data[:100],
                             headers=[f"Inference-Header-Content-Length: {len(header)}"])
    assert status == 400 and "has binary_data_size 128, but only 100 bytes" in json.loads(answer)["error"]
    # Content-Length promises more than arrives before the client stops
    # sending: nothing runs, the connection is closed.
    before = http.get_inference_statistics("mlp")["model_stats"][0]["inference_stats"]
    answer = raw_http(server, b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\n"
                              b"Content-Length: 1000\r\n\r\n{\"inputs\": []}", half_close=True)
    assert answer == b""
    after = http.get_inference_statistics("mlp")["model_stats"][0]["inference_stats"]
    assert after["fail"]["count"] == before["fail"]["count"]
    assert after["success"]["count"] == before["success"]["count"]
    still_serving(http)


def test_an_oversize_body_is_refused_from_its_content_length_before_it_is_sent(server, http):
    # Only the headers go out: the answer comes before any of the body.
    answer = raw_http(server, b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\n"
                              b"Content-Length: %d\r\n\r\n" % (MAX_BODY + 1))
    assert status_of(answer) == 413, answer
    assert "more than the server's limit of 1048576 bytes" in body_of(answer)["error"]
    # A chunked body, whose size is known only once read, is refused unread.
    answer = raw_http(server, b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\n"
                              b"Transfer-Encoding: chunked\r\n\r\n")
    assert status_of(answer) == 411, answer
    assert "Content-Length" in body_of(answer)["error"]
    still_serving(http)


def test_a_slow_or_silent_client_loses_its_connection_and_holds_up_nobody(server):
    slow = socket.create_connection(("127.0.0.1", server.http_port))
    slow.sendall(b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\nContent-Le")
    silent = socket.create_connection(("127.0.0.1", server.http_port))
    try:
        started = time.monotonic()
        still_serving_a_new_connection(server)  # Others are served meanwhile.
        for s in (slow, silent):
            s.settimeout(15)
            while s.recv(4096):  # The server closes it (--http_request_timeout_seconds=2).
                pass
        assert time.monotonic() - started < 15
    finally:
        slow.close()
        silent.close()
    still_serving_a_new_connection(server)


def test_loading_and_unloading_need_the_admin_token(server, http):
    status, _, answer = curl(server, "-X", "POST", path="/v2/repository/models/mlp/unload")
    assert status == 401 and "Authorization: Bearer" in json.loads(answer)["error"]
    assert http.is_model_ready("mlp")
    authorized = {"Authorization": f"Bearer {TOKEN}"}
    http.unload_model("mlp", headers=authorized)
    assert not http.is_model_ready("mlp")
    http.load_model("mlp", headers=authorized)
    assert http.is_model_ready("mlp")
    index = {m["name"]: m["state"] for m in http.get_model_repository_index()}
    assert index["mlp"] == "READY"


def test_draining_turns_http_readiness_off_while_requests_are_served(tmp_path):
    process = ServerProcess(built(BIN / "server" / "precompile_server"),
                            _repository(tmp_path / "repository", ("mlp",)),
                            ["--shutdown_delay_seconds=3"])
    client = httpclient.InferenceServerClient(process.http_address)
    try:
        assert client.is_server_ready()
        process.process.send_signal(15)
        process.await_output(r"event=draining")
        assert client.is_server_live()
        assert not client.is_server_ready()
        still_serving(client)
    finally:
        client.close()
        assert process.process.wait(timeout=30) == 0, process.log()


# --- TLS: HTTPS from the same flags; probes need no client certificate.

def _openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory):
    root = tmp_path_factory.mktemp("tls")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=test-ca",
             "-keyout", "ca.key", "-out", "ca.pem", cwd=root)
    for who in ("server", "client"):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={who}",
                 "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", f"{who}.key",
                 "-out", f"{who}.csr", cwd=root)
        _openssl("x509", "-req", "-in", f"{who}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                 "-CAcreateserial", "-days", "2", "-copy_extensions", "copy", "-out", f"{who}.pem",
                 cwd=root)
    process = ServerProcess(built(BIN / "server" / "precompile_server"),
                            _repository(root / "repository", ("mlp", "passthrough")),
                            [f"--tls_cert={root}/server.pem", f"--tls_key={root}/server.key",
                             f"--tls_client_ca={root}/ca.pem"])
    yield process, root
    assert process.stop() == 0, process.log()


def _https(server, root, path, *args):
    done = subprocess.run(["curl", "-sS", "-o", "/dev/stderr", "-w", "%{http_code}", "--max-time", "20",
                           *args, f"https://{server.http_address}{path}"],
                          capture_output=True, text=True)
    return done.stdout, done.stderr


def test_https_probes_answer_without_a_client_certificate_and_the_rest_need_one(tls_server):
    server, root = tls_server
    # As Kubernetes probes: HTTPS, no certificate check, no client certificate.
    assert _https(server, root, "/v2/health/live", "-k")[0] == "200"
    assert _https(server, root, "/v2/health/ready", "-k")[0] == "200"
    code, body = _https(server, root, "/v2/models/mlp", "-k")
    assert code == "401" and "client certificate" in body
    code, body = _https(server, root, "/v2/models/mlp", "--cacert", f"{root}/ca.pem",
                        "--cert", f"{root}/client.pem", "--key", f"{root}/client.key")
    assert code == "200" and json.loads(body)["name"] == "mlp"
    # Plain HTTP on the HTTPS port gets no answer.
    plain = subprocess.run(["curl", "-sS", "--max-time", "10", f"http://{server.http_address}/v2"],
                           capture_output=True, text=True)
    assert plain.returncode != 0


def test_https_sends_large_binary_outputs_whole(tls_server):
    # Over TLS each piece of an answer (head, JSON, each output sent from its
    # tensor) is written on its own: the client must still get them whole.
    server, root = tls_server
    context = ssl.create_default_context(cafile=str(root / "ca.pem"))
    context.load_cert_chain(str(root / "client.pem"), str(root / "client.key"))
    host, port = server.http_address.rsplit(":", 1)
    x = np.random.default_rng(4).standard_normal((1024, 4), dtype=np.float32)
    header = json.dumps({"inputs": [{"name": "x", "shape": [1024, 4], "datatype": "FP32",
                                     "parameters": {"binary_data_size": x.nbytes}}],
                         "parameters": {"binary_data_output": True}}).encode()
    connection = HTTPSConnection(host, int(port), context=context, timeout=20)
    try:
        for _ in range(3):  # on one kept-alive connection
            connection.request("POST", "/v2/models/passthrough/infer", body=header + x.tobytes(),
                               headers={"Inference-Header-Content-Length": str(len(header))})
            answer = connection.getresponse()
            body = answer.read()
            assert answer.status == 200, body
            json_length = int(answer.getheader("Inference-Header-Content-Length"))
            sizes = [o["parameters"]["binary_data_size"]
                     for o in json.loads(body[:json_length])["outputs"]]
            assert sizes == [16384, 8192, 16384]
            assert body[json_length:] == x.tobytes() + x[:512].tobytes() + (x * 2).tobytes()
    finally:
        connection.close()
