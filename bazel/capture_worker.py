"""Runs the capture rule's captures (bazel/capture.bzl) in a Bazel persistent
worker, so that a build imports torch, Dynamo, Inductor and transformers once
per worker instead of once per capture (about 3 s of every capture, 5 s of a
transformers model's).

Each capture still runs in a process of its own: a child forked from the
worker after those imports and before anything else, which imports the
capture tool and the model from the workspace (never the worker: a changed
capture tool or model is read again) and exits when the capture ends. So no
state of Dynamo, Inductor or the model outlives a capture, as when each ran in
a new Python.

    capture_worker.py [--root DIR]... [--env NAME=VALUE]... [--directory DIR]... ARG...
        runs `python -m precompile_capture ARG...` (`--script FILE ARG...`:
        the script as `__main__`) once; ARG may be @FLAGFILE, one per line
    capture_worker.py [--root DIR]... [--env NAME=VALUE]... [--directory DIR]... --persistent_worker
        serves Bazel's WorkRequests (protocol buffers, each after its length
        as a varint) on standard input, one at a time, each answered with a
        WorkResponse on standard output

`--root` puts a directory (relative to the working directory) on the
captures' import path, before the capture package; `--env` sets a variable
before torch is imported (Inductor reads its settings then); `--directory`
makes a directory the captures need (the compiler cache, TMPDIR).
"""

from __future__ import annotations

import os
import sys
import tempfile
import traceback
from typing import BinaryIO, List, Optional, Sequence, Tuple


def _parse_startup(argv: Sequence[str]) -> Tuple[List[str], List[str], bool]:
    roots: List[str] = []
    rest: List[str] = []
    persistent = False
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--root":
            roots.append(os.path.abspath(argv[i + 1]))
            i += 2
        elif arg == "--env":
            name, _, value = argv[i + 1].partition("=")
            os.environ[name] = value
            i += 2
        elif arg == "--directory":
            os.makedirs(argv[i + 1], exist_ok=True)
            i += 2
        elif arg == "--persistent_worker":
            persistent = True
            i += 1
        else:
            rest = list(argv[i:])
            break
    return roots, rest, persistent


def _expand_flagfiles(args: Sequence[str]) -> List[str]:
    expanded: List[str] = []
    for arg in args:
        if arg.startswith("@"):
            with open(arg[1:], encoding="utf-8") as f:
                expanded.extend(line for line in f.read().split("\n") if line)
        else:
            expanded.append(arg)
    return expanded


def _capture(roots: Sequence[str], args: Sequence[str]) -> int:
    """One capture, in this process: the capture CLI, or a script."""
    os.environ["PYTHONPATH"] = os.pathsep.join(
        list(roots) + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    # The import path `python -m` or `python script.py` starts with: the
    # working directory or the script's, then the roots (PYTHONPATH), then
    # the interpreter's own (this file's directory is not on it).
    interpreter_path = sys.path[1:]
    if args and args[0] == "--script":
        import runpy

        script = os.path.abspath(args[1])
        sys.path[:] = [os.path.dirname(script)] + list(roots) + interpreter_path
        sys.argv = [script] + list(args[2:])
        try:
            runpy.run_path(script, run_name="__main__")
        except SystemExit as e:
            return _exit_code(e)
        return 0
    sys.path[:] = [os.getcwd()] + list(roots) + interpreter_path
    sys.argv = ["precompile_capture"] + list(args)
    from precompile_capture.cli import main

    try:
        return main(list(args))
    except SystemExit as e:
        return _exit_code(e)


def _exit_code(e: SystemExit) -> int:
    if e.code is None:
        return 0
    if isinstance(e.code, int):
        return e.code
    print(e.code, file=sys.stderr)
    return 1


# What captures import, imported once in the worker: torch, what torch
# imports only as it exports and compiles (Inductor's code generators and
# passes, its C++ builder and packager), transformers (each of its models
# imports its modelling utilities) and the protocol buffer runtime.
_PRELOADED = (
    "torch", "torch._dynamo", "torch.export", "torch._export.passes",
    "torch._inductor.compile_fx", "torch._inductor.codecache", "torch._inductor.cpp_builder",
    "torch._inductor.lowering", "torch._inductor.fx_passes.post_grad",
    "torch._inductor.codegen.cpp", "torch._inductor.codegen.cpp_wrapper_cpu", "torch._inductor.package",
    "torch._inductor.debug", "torch.utils.cpp_extension", "torch.distributed.tensor", "sympy.combinatorics",
    "transformers", "transformers.modeling_utils", "torchvision",
    "google.protobuf.message", "google.protobuf.descriptor_pool",
)


def _preload() -> None:
    import importlib

    for name in _PRELOADED:
        try:
            importlib.import_module(name)
        except ImportError:
            pass  # not installed: a capture that needs it says so itself


def _end_with_parent() -> None:
    """A capture whose worker ends (Bazel interrupted, or done) ends too,
    instead of compiling on for nobody."""
    import ctypes
    import signal

    PR_SET_PDEATHSIG = 1
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL))
    except (OSError, AttributeError):
        pass


def _capture_in_child(roots: Sequence[str], args: Sequence[str]) -> Tuple[int, str]:
    """Forks a child that runs the capture with its output (stdout and
    stderr) in a file; returns its exit code and that output."""
    with tempfile.TemporaryFile() as output:
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                _end_with_parent()
                os.dup2(output.fileno(), 1)
                os.dup2(output.fileno(), 2)
                code = _capture(roots, args)
            except BaseException:
                traceback.print_exc()
            finally:
                try:
                    sys.stdout.flush()
                    sys.stderr.flush()
                finally:
                    os._exit(code if isinstance(code, int) and 0 <= code < 256 else 1)
        _, status = os.waitpid(pid, 0)
        output.seek(0)
        text = output.read().decode("utf-8", errors="replace")
    if os.WIFSIGNALED(status):
        signal = os.WTERMSIG(status)
        return 128 + signal, text + f"\ncapture_worker: the capture ended on signal {signal}\n"
    return os.WEXITSTATUS(status), text


# The worker protocol's two messages, written and read by hand (the fields
# below are all they use): WorkRequest {repeated string arguments = 1;
# int32 request_id = 3; ...}, WorkResponse {int32 exit_code = 1;
# string output = 2; int32 request_id = 3}.


def _read_varint(stream: BinaryIO) -> Optional[int]:
    """A varint read from `stream`, or None at its end."""
    data = b""
    while True:
        byte = stream.read(1)
        if not byte:
            return None
        data += byte
        if not byte[0] & 0x80:
            return _varint_at(data, 0)[0]


def _varint_at(data: bytes, pos: int) -> Tuple[int, int]:
    value, shift = 0, 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def _parse_request(data: bytes) -> Tuple[List[str], int]:
    arguments: List[str] = []
    request_id = 0
    pos = 0
    while pos < len(data):
        key, pos = _varint_at(data, pos)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint_at(data, pos)
            if field == 3:
                request_id = value
        elif wire == 2:
            length, pos = _varint_at(data, pos)
            if field == 1:
                arguments.append(data[pos:pos + length].decode("utf-8"))
            pos += length
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        else:
            raise ValueError(f"WorkRequest: wire type {wire} of field {field}")
    return arguments, request_id


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # int32's negative values take ten bytes
    out = bytearray()
    while True:
        if value < 0x80:
            out.append(value)
            return bytes(out)
        out.append((value & 0x7F) | 0x80)
        value >>= 7


def _response(exit_code: int, output: str, request_id: int) -> bytes:
    text = output.encode("utf-8")
    body = b"\x08" + _varint(exit_code) + b"\x12" + _varint(len(text)) + text
    if request_id:
        body += b"\x18" + _varint(request_id)
    return _varint(len(body)) + body


def _serve(roots: Sequence[str]) -> int:
    requests = os.fdopen(os.dup(0), "rb", buffering=0)
    responses = os.fdopen(os.dup(1), "wb")
    # Standard output carries only responses: whatever else is printed goes
    # to the worker's log.
    os.dup2(2, 1)
    _preload()
    while True:
        length = _read_varint(requests)
        if length is None:
            return 0
        data = b""
        while len(data) < length:
            chunk = requests.read(length - len(data))
            if not chunk:
                return 1
            data += chunk
        arguments, request_id = _parse_request(data)
        try:
            code, output = _capture_in_child(roots, _expand_flagfiles(arguments))
        except Exception:
            code, output = 1, traceback.format_exc()
        responses.write(_response(code, output, request_id))
        responses.flush()


def main(argv: Sequence[str]) -> int:
    roots, rest, persistent = _parse_startup(argv)
    if persistent:
        return _serve(roots)
    return _capture(roots, _expand_flagfiles(rest))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
