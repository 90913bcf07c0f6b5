"""The real precompile_server binary as a child process, for Python tests.

It listens on 127.0.0.1 with ports of its choice (--grpc_port=0, --http_port=0);
the tests read them from its `event=listening` log line and wait for
`event=ready`.
"""

import os
import pathlib
import re
import signal
import subprocess
import threading
import time
from typing import Mapping, Optional, Sequence

import pytest

BUILD_COMMAND = ("bazel build //server:precompile_server //client:precompile_client "
                 "//client:precompile_load //examples:artifacts //examples:blocks //gallery:gpt2")


def built(path: pathlib.Path) -> pathlib.Path:
    """`path` under bazel-bin, or the test fails saying what to build."""
    if not path.exists():
        pytest.fail(f"{path} is missing: run {BUILD_COMMAND} first")
    return path


class ServerProcess:
    """precompile_server serving `repository` on 127.0.0.1."""

    def __init__(self, binary: pathlib.Path, repository: pathlib.Path, flags: Sequence[str] = (),
                 ready_timeout: float = 120.0, env: Optional[Mapping[str, str]] = None,
                 ready_pattern: str = r"event=ready"):
        """`ready_pattern`: the log line that ends the start (event=not_ready
        when a model is expected to fail to load)."""
        self.process = subprocess.Popen(
            [str(binary), f"--model_repository={repository}", "--listen_address=127.0.0.1",
             "--grpc_port=0", "--metrics_port=-1", "--http_port=0", *flags],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        self.output = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.port = int(self.await_output(r"event=listening grpc_port=(\d+)"))
        # 0 when a flag turned HTTP off.
        self.http_port = int(self.await_output(r"event=listening .*http_port=(\d+)"))
        self.await_output(ready_pattern, timeout=ready_timeout)
        self.address = f"127.0.0.1:{self.port}"
        self.http_address = f"127.0.0.1:{self.http_port}"

    def _read(self):
        for line in self.process.stdout:
            self.output.append(line)

    def log(self) -> str:
        return "".join(self.output)

    def await_output(self, pattern: str, timeout: float = 60.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            match = re.search(pattern, self.log())
            if match:
                return match.group(1) if match.groups() else match.group(0)
            if self.process.poll() is not None:
                break
            time.sleep(0.02)
        raise AssertionError(f"no {pattern!r} from the server:\n{self.log()}")

    def stop(self) -> int:
        """SIGTERM, then the exit code (0 after a clean drain)."""
        self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(timeout=30)
        self._reader.join(timeout=5)
        return code


def copy_tree(source: pathlib.Path, destination: pathlib.Path) -> None:
    """Copies with symbolic links dereferenced, into writable plain files
    (bazel-bin's are read-only links into Bazel's cache)."""
    for directory, _, files in os.walk(source, followlinks=True):
        target = destination / pathlib.Path(directory).relative_to(source)
        target.mkdir(parents=True, exist_ok=True)
        for name in files:
            (target / name).write_bytes((pathlib.Path(directory) / name).read_bytes())
