"""The real precompile_server binary as a child process, for Python tests.

It listens on 127.0.0.1 with ports of its choice (--grpc_port=0, --http_port=0);
the tests read them from its `event=listening` log line and wait for
`event=ready`.
"""

import codecs
import os
import pathlib
import re
import select
import signal
import subprocess
import threading
import time
from typing import Mapping, Optional, Sequence

import pytest

def built(path: pathlib.Path) -> pathlib.Path:
    """`path` under bazel-bin, or the test fails saying what to build: what
    the Python tests run from bazel-bin (tools/test.sh builds the same list)."""
    if not path.exists():
        targets = (pathlib.Path(__file__).parent / "pytest_targets.txt").read_text().split()
        pytest.fail(f"{path} is missing: run bazel build {' '.join(targets)} first")
    return path


class LoggedProcess:
    """A child process whose output (stdout and stderr) is kept as it comes,
    for tests to wait for what it prints.

    The server writes each log line before it answers the request that
    caused it, so log() first takes what the pipe already holds: a test that
    reads the log after an answer sees every line written before it, however
    late the reading thread is scheduled."""

    def __init__(self, command: Sequence[str], name: str, **popen_args):
        self.name = name
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        **popen_args)
        self._pipe = self.process.stdout.fileno()
        os.set_blocking(self._pipe, False)
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._partial = ""
        self.lines = []
        self._ended = False
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _take_pipe(self):
        """Appends what the pipe holds now (under self._changed)."""
        while not self._ended:
            try:
                chunk = os.read(self._pipe, 1 << 16)
            except BlockingIOError:
                return
            text = self._partial + self._decoder.decode(chunk, final=not chunk)
            *whole, self._partial = text.split("\n")
            self.lines.extend(line + "\n" for line in whole)
            if not chunk:
                if self._partial:
                    self.lines.append(self._partial)
                self._ended = True
            self._changed.notify_all()

    def _read(self):
        while True:
            with self._changed:
                self._take_pipe()
                if self._ended:
                    break
            select.select([self._pipe], [], [])
        self.process.stdout.close()

    def log(self) -> str:
        with self._changed:
            self._take_pipe()
            return "".join(self.lines)

    def await_match(self, pattern: str, timeout: float = 60.0) -> re.Match:
        """The first line of its output (from the start) that matches
        `pattern`, waiting up to `timeout` seconds for it to come."""
        deadline = time.monotonic() + timeout
        seen = 0
        with self._changed:
            while True:
                for line in self.lines[seen:]:
                    found = re.search(pattern, line)
                    if found:
                        return found
                seen = len(self.lines)
                left = deadline - time.monotonic()
                if self._ended or left <= 0:
                    why = "ended" if self._ended else f"printed nothing like it within {timeout} s"
                    raise AssertionError(
                        f"no {pattern!r} from {self.name}: it {why}:\n{''.join(self.lines)[-6000:]}")
                self._changed.wait(left)

    def await_output(self, pattern: str, timeout: float = 60.0) -> str:
        """await_match's first group, or the whole match when it has none."""
        match = self.await_match(pattern, timeout)
        return match.group(1) if match.groups() else match.group(0)

    def wait(self, timeout: float) -> int:
        code = self.process.wait(timeout=timeout)
        self._reader.join(timeout=5)
        return code


class ServerProcess(LoggedProcess):
    """precompile_server serving `repository` on 127.0.0.1."""

    def __init__(self, binary: pathlib.Path, repository: pathlib.Path, flags: Sequence[str] = (),
                 ready_timeout: float = 120.0, env: Optional[Mapping[str, str]] = None,
                 ready_pattern: str = r"event=ready"):
        """`ready_pattern`: the log line that ends the start (event=not_ready
        when a model is expected to fail to load)."""
        super().__init__(
            [str(binary), f"--model_repository={repository}", "--listen_address=127.0.0.1",
             "--grpc_port=0", "--metrics_port=-1", "--http_port=0", *flags],
            "the server", env=env)
        self.port = int(self.await_output(r"event=listening grpc_port=(\d+)"))
        # 0 when a flag turned HTTP off.
        self.http_port = int(self.await_output(r"event=listening .*http_port=(\d+)"))
        self.await_output(ready_pattern, timeout=ready_timeout)
        self.address = f"127.0.0.1:{self.port}"
        self.http_address = f"127.0.0.1:{self.http_port}"

    def stop(self) -> int:
        """SIGTERM, then the exit code (0 after a clean drain)."""
        self.process.send_signal(signal.SIGTERM)
        return self.wait(timeout=30)


def copy_tree(source: pathlib.Path, destination: pathlib.Path) -> None:
    """Copies with symbolic links dereferenced, into writable plain files
    (bazel-bin's are read-only links into Bazel's cache)."""
    for directory, _, files in os.walk(source, followlinks=True):
        target = destination / pathlib.Path(directory).relative_to(source)
        target.mkdir(parents=True, exist_ok=True)
        for name in files:
            (target / name).write_bytes((pathlib.Path(directory) / name).read_bytes())
