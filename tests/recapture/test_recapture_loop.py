"""Traffic drives the next capture, end to end with the real binaries: a
server records the calls version 1 misses, the client exports them, the
capture tool recaptures them into version 2, a rescan swaps it in under load
with no failed request, and the same calls are then served by variants.

The model is examples/models.py's `nested`: its entry `forward` is flagged
eager_fallback (a graph break at k >= 1) and compiled only at batch 8, k=0;
its callee `encoder` is compiled only at batch 8 and not flagged. So a
batch-3 call with k=0 runs `forward` eagerly and `encoder` refuses it (the
request is refused), while a batch-8 call with k=2 is served eagerly.

Needs the Bazel build outputs: bazel build //server:precompile_server
//client:precompile_client //client:precompile_load //examples:artifacts.
Runs with the project's environment: .venv/bin/python -m pytest tests/recapture
"""

import json
import os
import pathlib
import re
import subprocess
import sys
import time
import urllib.request

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "testing"))
from server_process import ServerProcess, built, copy_tree  # noqa: E402

BIN = ROOT / "bazel-bin"

REFUSED_BATCH = '{"shape": [3, 4], "fill": "random"}'
BATCH8 = '{"shape": [8, 4], "fill": "random"}'


class Loop:
    """The server, the repository it serves and the tools that talk to it."""

    def __init__(self, root: pathlib.Path):
        self.root = root
        self.repository = root / "repository"
        copy_tree(built(BIN / "examples" / "nested"), self.repository / "nested" / "1")
        self.token = root / "admin-token"
        self.token.write_text("recapture-test-token\n")
        self.token.chmod(0o600)
        self.server = ServerProcess(built(BIN / "server" / "precompile_server"), self.repository,
                                    ["--metrics_port=0", f"--admin_token_file={self.token}"])
        self.metrics_port = int(self.server.await_output(r"event=listening .*metrics_port=(\d+)"))

    def client(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        result = subprocess.run(
            [str(built(BIN / "client" / "precompile_client")), f"--address={self.server.address}",
             f"--admin_token_file={self.token}", *args], capture_output=True, text=True, timeout=120)
        if check:
            assert result.returncode == 0, result.stdout + result.stderr
        return result

    def infer(self, x: str, k: int) -> subprocess.CompletedProcess:
        return self.client("--json", "infer", "nested", "--input", f"x={x}", "--param", f"k={k}",
                           check=False)

    def load(self, *args: str, timeout: float = 180) -> subprocess.Popen:
        return subprocess.Popen(
            [str(built(BIN / "client" / "precompile_load")), f"--address={self.server.address}",
             "--quiet", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def metric(self, name: str, **labels: str) -> float:
        text = urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics",
                                      timeout=10).read().decode()
        for line in text.splitlines():
            if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
                return float(line.rsplit(" ", 1)[1])
        raise AssertionError(f"no {name}{labels} in /metrics")


@pytest.fixture(scope="module")
def loop(tmp_path_factory):
    state = Loop(tmp_path_factory.mktemp("recapture"))
    yield state
    assert state.server.stop() == 0, state.server.log()


@pytest.fixture(scope="module")
def misses_file(loop):
    """Version 1 serves the calls, misses some, and exports its misses."""
    for _ in range(3):
        refused = loop.infer(REFUSED_BATCH, 0)
        assert refused.returncode == 1, refused.stdout + refused.stderr
        assert "FAILED_PRECONDITION" in refused.stdout + refused.stderr
    for _ in range(2):
        eager = loop.infer(BATCH8, 2)
        assert eager.returncode == 0, eager.stdout + eager.stderr
        assert json.loads(eager.stdout)["outcome"] == "eager_fallback"
    hit = loop.infer(BATCH8, 0)
    assert json.loads(hit.stdout)["outcome"] == "variant"

    exported = loop.client("--json", "misses", "nested")
    path = loop.root / "misses.json"
    path.write_text(exported.stdout)
    return path


def _signatures(misses, frame):
    for f in misses["frames"]:
        if f["frame"] == frame:
            return {_text(s["call"]): s for s in f["signatures"]}
    return {}


def _text(call):
    parts = []
    for a in call["arguments"]:
        if "tensor" in a:
            parts.append(f'{a["name"]}: {a["tensor"]["shape"]}')
        else:
            parts.append(f'{a["name"]}: {list(a["scalar"].values())[0]}')
    return ", ".join(parts)


def test_the_server_records_each_frames_missed_calls(loop, misses_file):
    misses = json.loads(misses_file.read_text())
    assert (misses["name"], misses["version"], misses["model_name"]) == ("nested", 1, "nested")
    forward = _signatures(misses, "forward")
    assert set(forward) == {"x: [3, 4], k: 0", "x: [8, 4], k: 2"}, "hits are no misses"
    assert forward["x: [3, 4], k: 0"]["count"] == 3
    assert forward["x: [3, 4], k: 0"]["outcome"] == "EAGER_FALLBACK"
    assert forward["x: [3, 4], k: 0"]["closest_variant"] == "forward#0"
    assert forward["x: [8, 4], k: 2"]["count"] == 2
    assert "k: expected 0, got 2" in forward["x: [8, 4], k: 2"]["failing_guard"]
    encoder = _signatures(misses, "encoder")
    assert set(encoder) == {"x: [3, 4]"}
    assert encoder["x: [3, 4]"]["outcome"] == "REFUSED"
    assert "x.size(0): expected 8, got 3" in encoder["x: [3, 4]"]["failing_guard"]

    table = loop.client("misses", "nested").stdout
    assert re.search(r"encoder\s+x: float32\[3, 4\]\s+3\s+refused\s+encoder#0: x.size\(0\)", table), table
    assert re.search(r"forward\s+x: float32\[8, 4\], k: 2\s+2\s+eager_fallback", table), table

    assert loop.metric("precompile_miss_signatures", model="nested", version="1",
                       frame="forward") == 2
    assert loop.metric("precompile_miss_signatures", model="nested", version="1",
                       frame="encoder") == 1
    assert loop.metric("precompile_miss_signatures", model="nested", version="1",
                       frame="scale") == 0


def test_misses_of_an_unknown_version_or_model_are_refused_by_name(loop, misses_file):
    unknown = loop.client("misses", "nested", "--model_version", "7", check=False)
    assert unknown.returncode == 1
    assert "NOT_FOUND" in unknown.stdout + unknown.stderr
    assert "7" in unknown.stdout + unknown.stderr
    nobody = loop.client("misses", "nobody", check=False)
    assert nobody.returncode == 1 and "nobody" in nobody.stdout + nobody.stderr


@pytest.fixture(scope="module")
def recaptured(loop, misses_file):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "capture")]))
    result = subprocess.run(
        [sys.executable, "-m", "precompile_capture", "--model", "examples.models:make_nested",
         "--recapture", str(loop.repository / "nested"), "--misses", str(misses_file)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_the_recapture_covers_what_it_can_and_says_what_stays_eager(loop, recaptured):
    assert sorted(os.listdir(loop.repository / "nested")) == ["1", "2"], "no staging directory left"
    lines = recaptured.splitlines()

    def line_of(needle):
        found = [line for line in lines if needle in line]
        assert found, f"no {needle!r} in:\n{recaptured}"
        return found[0]

    assert "covered by variant forward#" in line_of("forward(x: float32[3, 4], k: 0)")
    assert "stays eager" in line_of("forward(x: float32[8, 4], k: 2)")
    # encoder is not replayed itself; the forward calls at batches 8 and 3 made
    # its batch dynamic, which the report judges from version 2's guards.
    assert "covered by variant encoder#" in line_of("encoder(x: float32[3, 4])")


def test_a_rescan_swaps_version_2_in_under_load_without_a_failed_request(loop, recaptured):
    mix = loop.root / "mix.json"
    mix.write_text(json.dumps([
        {"name": "hit", "model": "nested", "inputs": {"x": json.loads(BATCH8)}, "params": {"k": 0}},
        {"name": "eager", "model": "nested", "inputs": {"x": json.loads(BATCH8)},
         "params": {"k": 2}},
    ]))
    report = loop.root / "swap.json"
    load = loop.load(f"--mix={mix}", "--concurrency=4", "--duration=8",
                     f"--json_out={report}")
    time.sleep(2)
    rescan = loop.client("rescan")
    assert re.search(r"nested\s+2\s+READY", rescan.stdout), rescan.stdout
    out, err = load.communicate(timeout=120)
    assert load.returncode == 0, out + err
    phase = json.loads(report.read_text())["phases"][0]
    assert phase["requests"] > 0
    assert phase["errors"] == 0, phase
    assert loop.metric("precompile_requests_total", model="nested", version="2",
                       outcome="variant") > 0, "version 2 served part of the load"


def test_version_2_serves_the_calls_version_1_missed_by_variants(loop, misses_file, recaptured):
    # Runs after the swap (pytest keeps the file's order).
    refused_before = loop.infer(REFUSED_BATCH, 0)
    assert refused_before.returncode == 0, refused_before.stdout + refused_before.stderr
    served = json.loads(refused_before.stdout)
    assert (served["model_version"], served["outcome"]) == ("2", "variant")

    report = loop.root / "replay.json"
    replay = loop.load(f"--misses={misses_file}", "--concurrency=2", "--requests=20",
                       f"--json_out={report}")
    out, err = replay.communicate(timeout=120)
    assert replay.returncode == 0, out + err
    phase = json.loads(report.read_text())["phases"][0]
    assert phase["errors"] == 0, phase
    templates = phase["templates"]
    assert set(templates) == {"forward(x: float32[3, 4], k: 0)", "forward(x: float32[8, 4], k: 2)"}
    assert set(templates["forward(x: float32[3, 4], k: 0)"]) == {"variant"}, templates
    assert set(templates["forward(x: float32[8, 4], k: 2)"]) == {"eager_fallback"}, templates

    after = json.loads(loop.client("--json", "misses", "nested").stdout)
    assert after["version"] == 2
    assert "x: [3, 4], k: 0" not in _signatures(after, "forward")
    assert _signatures(after, "encoder") == {}
