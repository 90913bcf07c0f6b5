"""The persistent worker that runs the capture rule's captures
(bazel/capture_worker.py), driven as Bazel drives it: WorkRequests on its
standard input, WorkResponses read back. Each request runs a script through
the worker's `--script` mode, so that no test compiles anything."""

import os
import pathlib
import signal
import subprocess
import sys
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bazel"))
import capture_worker  # noqa: E402


def _request(arguments, request_id):
    body = b"".join(b"\x0a" + capture_worker._varint(len(a.encode())) + a.encode() for a in arguments)
    # An input (field 2) as Bazel sends each one: the worker skips it.
    digest = b"\x0a\x03x.py\x12\x02ab"
    body += b"\x12" + capture_worker._varint(len(digest)) + digest
    if request_id:
        body += b"\x18" + capture_worker._varint(request_id)
    return capture_worker._varint(len(body)) + body


def _read_response(stream):
    length = capture_worker._read_varint(stream)
    assert length is not None, "the worker closed its output"
    data = stream.read(length)
    fields = {}
    pos = 0
    while pos < len(data):
        key, pos = capture_worker._varint_at(data, pos)
        if key & 7 == 0:
            fields[key >> 3], pos = capture_worker._varint_at(data, pos)
        else:
            length, pos = capture_worker._varint_at(data, pos)
            fields[key >> 3] = data[pos:pos + length].decode()
            pos += length
    return fields.get(1, 0), fields.get(2, ""), fields.get(3, 0)


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    directory = tmp_path_factory.mktemp("worker")
    process = subprocess.Popen(
        [sys.executable, str(ROOT / "bazel" / "capture_worker.py"), "--root", "lib",
         "--env", "CAPTURE_WORKER_TEST=from the startup flags", "--persistent_worker"],
        cwd=directory, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    (directory / "lib").mkdir()

    def run(script, request_id=0, args=()):
        path = directory / f"script_{request_id}.py"
        path.write_text(textwrap.dedent(script))
        process.stdin.write(_request(["--script", str(path), *args], request_id))
        process.stdin.flush()
        return _read_response(process.stdout)

    run.directory = directory
    yield run
    process.stdin.close()
    assert process.wait(timeout=60) == 0
    process.stdout.close()


def test_a_request_answers_with_its_exit_code_output_and_id(worker):
    code, output, request_id = worker("""
        import os, sys
        print("to stdout", os.environ["CAPTURE_WORKER_TEST"])
        print("to stderr", sys.argv[1:], file=sys.stderr)
        sys.exit(3)
        """, request_id=7, args=["OUT"])
    assert (code, request_id) == (3, 7)
    assert "to stdout from the startup flags" in output
    assert "to stderr ['OUT']" in output


def test_the_roots_and_the_scripts_directory_are_importable(worker):
    (worker.directory / "lib" / "from_root.py").write_text("VALUE = 'root'\n")
    (worker.directory / "beside.py").write_text("VALUE = 'beside'\n")
    code, output, _ = worker("""
        import beside, from_root
        print(beside.VALUE, from_root.VALUE)
        """, request_id=1)
    assert code == 0, output
    assert "beside root" in output


def test_torch_is_imported_once_and_the_capture_tool_never(worker):
    # The capture tool and the models are read at each capture: a changed
    # one must never be served from the worker's memory.
    code, output, _ = worker("""
        import sys
        print(sorted(m for m in ("torch", "torch._inductor.compile_fx", "precompile_capture")
                     if m in sys.modules))
        """, request_id=2)
    assert code == 0, output
    assert "['torch', 'torch._inductor.compile_fx']" in output


def test_what_a_capture_changes_ends_with_it(worker):
    code, output, _ = worker("""
        import torch._dynamo
        torch._dynamo.config.cache_size_limit = 12345
        import sys
        sys.modules["left_behind"] = sys
        """, request_id=3)
    assert code == 0, output
    code, output, _ = worker("""
        import sys, torch._dynamo
        print(torch._dynamo.config.cache_size_limit, "left_behind" in sys.modules)
        """, request_id=4)
    assert code == 0, output
    assert "12345" not in output and "False" in output


def test_a_capture_that_dies_is_answered_and_the_worker_serves_on(worker):
    code, output, request_id = worker(f"""
        import os
        print("before", flush=True)
        os.kill(os.getpid(), {int(signal.SIGKILL)})
        """, request_id=5)
    assert (code, request_id) == (128 + signal.SIGKILL, 5)
    assert "before" in output and f"ended on signal {int(signal.SIGKILL)}" in output
    code, output, _ = worker("print('after')", request_id=6)
    assert code == 0 and "after" in output


def test_an_exception_is_a_failure_with_its_traceback(worker):
    code, output, _ = worker("raise ValueError('the model is wrong')", request_id=8)
    assert code == 1
    assert "ValueError: the model is wrong" in output


def test_without_the_persistent_flag_it_runs_once_from_a_flagfile(tmp_path):
    script = tmp_path / "once.py"
    script.write_text("import os, sys\nprint(os.environ['CAPTURE_WORKER_TEST'], sys.argv[1:])\nsys.exit(4)\n")
    flagfile = tmp_path / "args"
    flagfile.write_text(f"--script\n{script}\nfirst\nsecond\n")
    made = tmp_path / "compiler" / "cache"
    result = subprocess.run(
        [sys.executable, str(ROOT / "bazel" / "capture_worker.py"), "--env", "CAPTURE_WORKER_TEST=once",
         "--directory", str(made), f"@{flagfile}"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 4
    assert "once ['first', 'second']" in result.stdout
    assert made.is_dir()
