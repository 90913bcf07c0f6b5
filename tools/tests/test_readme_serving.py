"""The README's first command serves, and the calls the README shows under
Serving work against it as written (only the ports are the test's own).

It runs `tools/serve_examples.sh` itself, so it needs the plain build that
the README's test command makes before pytest (the script's builds are then
cached); the gallery's models join the running server through its rescan.
"""

import os
import pathlib
import re
import shlex
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
sys.path.insert(0, str(ROOT / "tests" / "testing"))
from server_process import LoggedProcess  # noqa: E402


def readme_block(after: str, language: str) -> str:
    """The first ```language block that follows the line starting with `after`."""
    text = README.read_text()
    start = text.index("\n" + after)
    match = re.compile(r"^```" + language + r"\n(.*?)^```", re.S | re.M).search(text, start)
    assert match, f"README: no {language} block after {after!r}"
    return match.group(1)


def shell_commands(block: str):
    """The block's commands: continued lines and quoted newlines joined."""
    commands, pending = [], ""
    for line in block.splitlines():
        pending += line + "\n"
        if pending.rstrip().endswith("\\"):
            continue
        try:
            shlex.split(pending)
        except ValueError:  # a quote still open
            continue
        if pending.strip():
            commands.append(pending.strip())
        pending = ""
    assert not pending.strip(), f"README: unterminated command {pending!r}"
    return commands


class ServeExamples(LoggedProcess):
    """tools/serve_examples.sh on ports of its server's choice."""

    def __init__(self, repository: pathlib.Path):
        super().__init__(
            ["tools/serve_examples.sh", "--grpc_port=0", "--http_port=0", "--metrics_port=0"],
            "serve_examples.sh", cwd=ROOT, env=dict(os.environ, SERVE_REPOSITORY=str(repository)))


def http_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code
    except OSError:
        return 0


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    serve = ServeExamples(tmp_path_factory.mktemp("serve") / "repository")
    # The set-up and the builds are done (or cached) before the server starts.
    ports = serve.await_match(
        r"event=listening grpc_port=(\d+) metrics_port=(\d+) http_port=(\d+)", timeout=900)
    serve.grpc, serve.metrics, serve.http = (int(p) for p in ports.groups())
    serve.await_match(r"event=ready", timeout=120)
    yield serve
    if serve.process.poll() is None:
        serve.process.send_signal(signal.SIGTERM)
        serve.wait(timeout=120)


def await_ready(serve, model: str, timeout: float):
    url = f"http://127.0.0.1:{serve.http}/v2/models/{model}/ready"
    deadline = time.monotonic() + timeout
    while http_status(url) != 200:
        if time.monotonic() > deadline or serve.process.poll() is not None:
            pytest.fail(f"{model} not ready within {timeout} s:\n{serve.log()[-4000:]}")
        time.sleep(0.5)


def on_test_ports(command: str, serve) -> str:
    command = command.replace("localhost:8000", f"127.0.0.1:{serve.http}")
    command = command.replace("localhost:8002", f"127.0.0.1:{serve.metrics}")
    command = command.replace("127.0.0.1:8001", f"127.0.0.1:{serve.grpc}")
    return command.replace("bazel-bin/client/precompile_client",
                           f"bazel-bin/client/precompile_client --address=127.0.0.1:{serve.grpc}")


def test_the_examples_are_served_first_and_the_gallery_joins(served):
    # The examples were in the repository when the server started.
    for model in ("mlp", "loop", "branch", "nested", "dtypes", "passthrough"):
        assert http_status(f"http://127.0.0.1:{served.http}/v2/models/{model}/ready") == 200, model
    for model in ("resnet18", "bert", "roberta", "opt", "gpt2", "gpt2_decoder", "llama_decoder",
                  "t5_decoder", "bert_recentering", "gpt2_decoder_recentering"):
        served.await_match(rf"\[serve\] gallery: {model} is in the repository", timeout=1800)
        await_ready(served, model, timeout=120)
    for model in ("gpt2_decoder_stateful", "llama_decoder_stateful", "t5_decoder_stateful"):
        await_ready(served, model, timeout=120)


def test_the_readme_calls_answer(served):
    await_ready(served, "bert", timeout=1800)
    commands = shell_commands(readme_block("Call it with the client tools", "sh"))
    assert len(commands) >= 7, commands
    for command in commands:
        run = subprocess.run(["bash", "-o", "pipefail", "-c", on_test_ports(command, served)],
                             cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, f"{command}\n{run.stdout}\n{run.stderr}"
        assert run.stdout.strip(), f"{command} printed nothing"
        # Over HTTP an error is a JSON object with "error" (curl -s exits 0).
        assert not run.stdout.lstrip().startswith('{"error"'), f"{command}\n{run.stdout}"


def test_the_readme_generation_prints_the_tokens(served):
    # The cache sent back and forth, then kept by the server: the same tokens;
    # then a batch of two prompts, the first the same: its row the same again.
    await_ready(served, "gpt2_decoder_stateful", timeout=1800)
    commands = shell_commands(readme_block("Generate with the gallery's decoder", "sh"))
    assert len(commands) == 3, commands
    printed = []
    for command in commands:
        run = subprocess.run(["bash", "-o", "pipefail", "-c", on_test_ports(command, served)],
                             cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, f"{command}\n{run.stdout}\n{run.stderr}"
        rows = [line.split(",") for line in run.stdout.strip().splitlines()]
        assert all(len(tokens) == 8 and all(0 <= int(t) < 1000 for t in tokens) for tokens in rows), (
            run.stdout)
        printed.append(rows)
    assert [len(rows) for rows in printed] == [1, 1, 2]
    assert printed[0] == printed[1] == printed[2][:1]


def test_the_readme_python_client_prints_what_the_readme_says(served):
    await_ready(served, "bert", timeout=1800)
    code = readme_block("or from Python with the generated stubs", "python")
    expected = re.search(r"print\(.*\)\s*#\s*(.+)$", code, re.M)
    assert expected, "README: the Python example says what it prints"
    run = subprocess.run([sys.executable, "-c", on_test_ports(code, served)], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == expected.group(1).strip()


def test_sigterm_drains_the_server_and_ends_the_script(served):
    served.process.send_signal(signal.SIGTERM)
    assert served.wait(timeout=120) == 0, served.log()[-4000:]
    output = served.log()
    assert "event=draining" in output and "event=stopped" in output, output[-4000:]
