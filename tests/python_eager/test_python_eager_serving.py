"""Python eager programs, end to end: the real server runs the misses of a
flagged frame that TorchScript cannot script in its embedded interpreter.

The models: examples/models.py's `blocks` (its entry takes **kwargs and logs,
is compiled at batch 8 with steps=0 and flagged eager_fallback, a graph break
in a loop at steps >= 1; its blocks are frames compiled at batch 8), and the
two models user_script.py captures of its own classes, run as `__main__` (one
calls a captured function frame, one is defined inside a function). Each
program carries the model's own code by value, so the server, which reads no
PYTHONPATH and gets no --python_path here, needs none of it; it loads them
only with --allow_python_programs.

Needs the Bazel build outputs: bazel build //server:precompile_server
//examples:artifacts //examples:blocks //tests/python_eager:user_script (the
server pulls in the Python plugin).
Runs with the project's environment: .venv/bin/python -m pytest tests/python_eager
"""

import contextlib
import importlib.util
import os
import pathlib
import platform
import re
import sys
import urllib.request

import numpy as np
import pytest
import torch
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "testing"))
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bazel-bin"))
from server_process import ServerProcess, built, copy_tree  # noqa: E402

from examples import models  # noqa: E402
from proto import artifact_pb2  # noqa: E402

BIN = ROOT / "bazel-bin"
USER_SCRIPT = BIN / "tests" / "python_eager" / "user_script"
# A server with a model that failed to load is not ready (strict readiness).
NOT_READY = r"event=not_ready models_ready=1 models_failed=1"


def serve(root: pathlib.Path, artifacts, flags=(), python_path="", allow=True,
          ready=r"event=ready") -> ServerProcess:
    """A server on a repository of (model, artifact directory, manifest edit),
    with --python_path (none when empty) and --allow_python_programs when
    `allow`. Its environment has PYTHONPATH=ROOT, which it must ignore."""
    repository = root / "repository"
    for name, source, edit in artifacts:
        target = repository / name / "1"
        copy_tree(built(source), target)
        if edit is not None:
            manifest = artifact_pb2.Manifest()
            manifest.ParseFromString((target / "MANIFEST.pb").read_bytes())
            edit(manifest)
            (target / "MANIFEST.pb").write_bytes(manifest.SerializeToString())
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    flags = [*(["--allow_python_programs"] if allow else []),
             *([f"--python_path={python_path}"] if python_path else []), *flags]
    return ServerProcess(built(BIN / "server" / "precompile_server"), repository,
                         ["--metrics_port=0", *flags], env=env, ready_pattern=ready)


@contextlib.contextmanager
def http_client(server: ServerProcess):
    # Closed, so that no kept-alive connection holds up the server's drain.
    client = httpclient.InferenceServerClient(server.http_address)
    try:
        yield client
    finally:
        client.close()


def infer(server: ServerProcess, x: np.ndarray, steps: int, model: str = "blocks"):
    t = httpclient.InferInput("x", list(x.shape), "FP32")
    t.set_data_from_numpy(x)
    with http_client(server) as client:
        return client.infer(model, [t], parameters={"steps": steps})


def metrics(server: ServerProcess) -> str:
    port = int(server.await_output(r"event=listening .*metrics_port=(\d+)"))
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return r.read().decode()


def python_loaded(server: ServerProcess) -> bool:
    maps = pathlib.Path(f"/proc/{server.process.pid}/maps").read_text()
    return "libpython" in maps


@pytest.fixture(scope="module")
def blocks_server(tmp_path_factory):
    server = serve(tmp_path_factory.mktemp("blocks"),
                   [("blocks", BIN / "examples" / "blocks", None),
                    ("mlp", BIN / "examples" / "mlp", None)])
    yield server
    assert server.stop() == 0


@pytest.fixture(scope="module")
def model():
    return models.make_blocks()


def test_misses_run_the_frames_python_and_callees_their_variants(blocks_server, model):
    rng = np.random.default_rng(0)
    for steps, outcome in [(0, "variant"), (1, "eager_fallback"), (2, "eager_fallback")]:
        x = rng.standard_normal((8, 4), dtype=np.float32)
        result = infer(blocks_server, x, steps)
        assert result.get_response()["parameters"]["precompile_outcome"] == outcome
        expected = model(torch.from_numpy(x), steps=steps).detach().numpy()
        # Compiled kernels may round differently from eager by an ulp,
        # depending on the CPU's vector width (seen with AVX-512).
        np.testing.assert_allclose(result.as_numpy("output0"), expected, rtol=1e-6, atol=1e-6,
                                   err_msg=f"steps={steps}")
    # The blocks ran their variants inside the Python program.
    text = metrics(blocks_server)
    for block in ("blocks.0", "blocks.1"):
        hits = re.search(r'precompile_variant_hits_total\{[^}]*model="blocks"[^}]*variant="'
                         + re.escape(block) + r'#0"[^}]*\} (\d+)', text)
        assert hits and int(hits.group(1)) >= 2, text


def test_an_eager_miss_warns_once_per_frame(blocks_server):
    x = np.ones((8, 4), dtype=np.float32)
    for _ in range(3):
        infer(blocks_server, x, 1)
    assert len(re.findall(r"event=eager_fallback model=blocks frame=forward", blocks_server.log())) == 1
    warnings = re.search(r'precompile_eager_fallback_warnings_total\{[^}]*frame="forward"[^}]*model="blocks"[^}]*\} (\d+)',
                         metrics(blocks_server))
    assert warnings and int(warnings.group(1)) == 1


def test_a_callees_refusal_refuses_the_call_unchanged(blocks_server):
    # forward runs in Python at batch 3; blocks.0 has no batch-3 variant.
    with pytest.raises(InferenceServerException) as refused:
        infer(blocks_server, np.ones((3, 4), dtype=np.float32), 1)
    assert refused.value.status() == "400"
    assert "no captured variant matches this call of frame 'blocks.0'" in refused.value.message()


def test_a_raising_program_answers_internal_and_the_server_keeps_serving(blocks_server, model):
    x = np.ones((8, 4), dtype=np.float32)
    for _ in range(2):
        with pytest.raises(InferenceServerException) as failed:
            infer(blocks_server, x, -1)
        assert failed.value.status() == "500"
        assert failed.value.message() == (
            "frame 'forward': its Python eager program failed: ValueError: steps must be at least 0, not -1")
    # The traceback is logged once per frame, and names the model's code.
    log = blocks_server.log()
    assert len(re.findall(r"event=python_eager_error frame=forward", log)) == 1
    assert "examples/models.py" in log and "raise ValueError" in log
    result = infer(blocks_server, x, 1)
    np.testing.assert_allclose(result.as_numpy("output0"),
                               model(torch.from_numpy(x), steps=1).detach().numpy(), rtol=1e-6, atol=1e-6)


def test_a_result_of_another_structure_answers_internal_naming_the_frame(blocks_server):
    with pytest.raises(InferenceServerException) as failed:
        infer(blocks_server, np.ones((8, 4), dtype=np.float32), 5)
    assert failed.value.status() == "500"
    assert "frame 'forward'" in failed.value.message(), failed.value.message()
    assert "eager program" in failed.value.message(), failed.value.message()


def test_an_artifact_without_python_never_starts_the_interpreter(tmp_path):
    server = serve(tmp_path, [("mlp", BIN / "examples" / "mlp", None),
                              ("loop", BIN / "examples" / "loop", None)])
    try:
        t = httpclient.InferInput("x", [8, 4], "FP32")
        t.set_data_from_numpy(np.ones((8, 4), dtype=np.float32))
        # loop's eager program is TorchScript.
        with http_client(server) as client:
            outcome = client.infer("loop", [t], parameters={"n": 1}).get_response()["parameters"]
        assert outcome["precompile_outcome"] == "eager_fallback"
        assert not python_loaded(server)
    finally:
        assert server.stop() == 0


def test_the_python_artifact_starts_it(blocks_server):
    assert python_loaded(blocks_server)


def add_module(name, version):
    def edit(manifest):
        manifest.python.modules.add(name=name, version=version)
    return edit


@pytest.mark.parametrize("edit, message", [
    (add_module("no_such_module_anywhere", "1.2.3"),
     "need module no_such_module_anywhere 1.2.3, which the server's Python environment"),
    (add_module("numpy", "0.0.1"),
     "need module numpy 0.0.1; the server's Python environment"),
    (lambda m: setattr(m.python, "python_version", "3.9.18"),
     "captured with Python 3.9.18; the server's Python is 3."),
])
def test_an_environment_that_cannot_run_the_program_refuses_the_model_only(tmp_path, edit, message):
    server = serve(tmp_path, [("blocks", BIN / "examples" / "blocks", edit),
                              ("mlp", BIN / "examples" / "mlp", None)], ready=NOT_READY)
    try:
        failure = server.await_output(r"event=model_load_failed model=blocks version=1 reason=\"([^\"]*)\"")
        assert message in failure
        with http_client(server) as client:
            assert client.is_model_ready("mlp") and not client.is_model_ready("blocks")
    finally:
        assert server.stop() == 0


def test_code_changed_after_the_capture_still_serves_what_was_captured(tmp_path, model):
    # The server finds an examples.models whose code differs from the
    # captured one; the program carries its own, and never imports it.
    changed = tmp_path / "changed" / "examples"
    changed.mkdir(parents=True)
    (changed / "__init__.py").write_text("")
    (changed / "models.py").write_text(
        "def opaque(y):\n    raise RuntimeError('the changed examples.models ran')\n"
        "class Blocks:\n    def forward(self, *args, **kwargs):\n"
        "        raise RuntimeError('the changed examples.models ran')\n")
    server = serve(tmp_path, [("blocks", BIN / "examples" / "blocks", None)],
                   python_path=str(tmp_path / "changed"))
    try:
        x = np.random.default_rng(1).standard_normal((8, 4), dtype=np.float32)
        result = infer(server, x, 2)
        assert result.get_response()["parameters"]["precompile_outcome"] == "eager_fallback"
        np.testing.assert_allclose(result.as_numpy("output0"),
                                   model(torch.from_numpy(x), steps=2).detach().numpy(), rtol=1e-6, atol=1e-6)
    finally:
        assert server.stop() == 0


def load_user_script():
    """user_script.py as a module of this process, for the models' eager results."""
    spec = importlib.util.spec_from_file_location("user_script", pathlib.Path(__file__).parent / "user_script.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def script_server(tmp_path_factory):
    server = serve(tmp_path_factory.mktemp("script"),
                   [("script", USER_SCRIPT / "script", None), ("local", USER_SCRIPT / "local", None)])
    yield server
    assert server.stop() == 0


@pytest.mark.parametrize("name, make", [("script", "make_model"), ("local", "make_local")])
def test_a_scripts_own_models_serve_without_the_script(script_server, name, make):
    eager = getattr(load_user_script(), make)()
    rng = np.random.default_rng(2)
    for steps, outcome in [(0, "variant"), (1, "eager_fallback"), (3, "eager_fallback")]:
        x = rng.standard_normal((8, 4), dtype=np.float32)
        result = infer(script_server, x, steps, name)
        assert result.get_response()["parameters"]["precompile_outcome"] == outcome
        np.testing.assert_allclose(result.as_numpy("output0"),
                                   eager(torch.from_numpy(x), steps=steps).detach().numpy(),
                                   rtol=1e-6, atol=1e-6, err_msg=f"{name} steps={steps}")


def variant_hits(server, model_name, variant):
    hits = re.search(r'precompile_variant_hits_total\{[^}]*model="' + model_name + r'"[^}]*variant="'
                     + re.escape(variant) + r'"[^}]*\} (\d+)', metrics(server))
    return int(hits.group(1)) if hits else 0


def test_a_function_frame_called_from_a_scripts_python_runs_its_own_variants(script_server):
    before = variant_hits(script_server, "script", "scale#0")
    infer(script_server, np.ones((8, 4), dtype=np.float32), 2, "script")
    assert variant_hits(script_server, "script", "scale#0") == before + 1
    # At batch 3 the Python runs (forward's variant is batch 8), and `scale`,
    # not flagged and compiled at batch 8 only, refuses the call.
    with pytest.raises(InferenceServerException) as refused:
        infer(script_server, np.ones((3, 4), dtype=np.float32), 1, "script")
    assert refused.value.status() == "400"
    assert "no captured variant matches this call of frame 'scale'" in refused.value.message()


def test_what_a_program_logs_on_every_call_reaches_the_servers_log_rate_limited(script_server):
    # `note` logs a warning at each step (logging's last resort: sys.stderr).
    # A client asking for 300 steps gets no more than the server's 100 lines
    # a minute of it (two windows at most, if one ends during the burst),
    # each line whole, stamped as the server's own lines are.
    before = len(script_server.log())
    for _ in range(100):
        infer(script_server, np.ones((8, 4), dtype=np.float32), 3, "script")
    logged = script_server.log()[before:].splitlines()
    steps = [line for line in logged if "step on" in line]
    assert 1 <= len(steps) <= 200, len(steps)
    stamp = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3} warning \[stderr\] ")
    assert {stamp.sub("", line, count=1) for line in steps} == {"step on (8, 4)"}, steps[:3]


def test_the_manifest_and_frames_name_the_code_the_program_carries():
    manifest = artifact_pb2.Manifest()
    manifest.ParseFromString((USER_SCRIPT / "script" / "MANIFEST.pb").read_bytes())
    forward = next(f for f in manifest.frames if f.name == "forward")
    [code] = forward.python_program.code_by_value
    # `scale` is a frame: the program calls it through the server.
    assert (code.module, list(code.qualified_names)) == ("__main__", ["Model", "note"])
    assert re.fullmatch(r"[0-9a-f]{64}", code.sha256)
    assert [m.name for m in manifest.python.modules] == ["cloudpickle", "torch"]
    frames = (USER_SCRIPT / "script" / "FRAMES").read_text()
    assert f"Python by value: __main__: Model, note (sha256 {code.sha256[:16]})" in frames


def test_python_programs_load_only_when_the_server_allows_them(tmp_path):
    server = serve(tmp_path, [("blocks", BIN / "examples" / "blocks", None),
                              ("mlp", BIN / "examples" / "mlp", None)], allow=False,
                   ready=NOT_READY)
    try:
        failure = server.await_output(r"event=model_load_failed model=blocks version=1 reason=\"([^\"]*)\"")
        assert ("frame 'forward' has a Python eager program, which this server loads only when "
                "started with --allow_python_programs") in failure
        # Refused before anything of Python was loaded.
        assert not python_loaded(server)
        with http_client(server) as client:
            assert client.is_model_ready("mlp") and not client.is_model_ready("blocks")
    finally:
        assert server.stop() == 0


def test_an_environment_of_another_python_build_refuses_the_model_by_name(tmp_path):
    # A virtual environment made from another Python: its standard library
    # would fail in this interpreter naming neither ("No module named '_csv'").
    env = tmp_path / "other-env"
    (env / "bin").mkdir(parents=True)
    (env / "bin" / "python3").symlink_to(sys.executable)
    (env / "pyvenv.cfg").write_text("home = /usr/bin\ninclude-system-site-packages = false\nversion = 3.10.2\n")
    server = serve(tmp_path, [("blocks", BIN / "examples" / "blocks", None),
                              ("mlp", BIN / "examples" / "mlp", None)],
                   flags=[f"--python_env={env}"], ready=NOT_READY)
    try:
        failure = server.await_output(r"event=model_load_failed model=blocks version=1 reason=\"([^\"]*)\"")
        assert (f"the Python environment {env} was made from Python 3.10.2 (its pyvenv.cfg), and this server "
                f"embeds Python {platform.python_version()}") in failure, failure
        with http_client(server) as client:
            assert client.is_model_ready("mlp")
    finally:
        assert server.stop() == 0


def test_a_missing_environment_refuses_the_model_only(tmp_path):
    server = serve(tmp_path, [("blocks", BIN / "examples" / "blocks", None),
                              ("mlp", BIN / "examples" / "mlp", None)],
                   flags=[f"--python_env={tmp_path}/no-such-env"], ready=NOT_READY)
    try:
        failure = server.await_output(r"event=model_load_failed model=blocks version=1 reason=\"([^\"]*)\"")
        assert f"no Python interpreter at {tmp_path}/no-such-env/bin/python3" in failure
        with http_client(server) as client:
            assert client.is_model_ready("mlp")
    finally:
        assert server.stop() == 0
