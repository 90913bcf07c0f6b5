"""Frame definitions, parameter kinds, the calls file and the command line.
No AOTInductor compile happens here."""

import json
import os
import re
import subprocess
import sys

import pytest
import torch

import precompile_capture
from precompile_capture import PrecompileError
from precompile_capture.cli import load_calls, make_tensor
from models_for_tests import Kinds, Nested, Plain, scale

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_parameter_kinds_from_annotations_defaults_and_first_call():
    def decline(ep):
        raise torch._dynamo.exc.SkipFrame("no compile in this test")

    cap = precompile_capture.capture(Kinds(), name="k", decline=decline)
    cap(torch.ones(2), None, 4, 1.5, True, "b")
    assert cap.frame("forward").parameters == (
        ("x", "TENSOR"),
        ("mask", "OPTIONAL_TENSOR"),
        ("n", "INT"),
        ("alpha", "FLOAT"),
        ("flag", "BOOL"),
        ("mode", "STRING"),
    )


def test_parameter_kind_conflicts_are_errors():
    cap = precompile_capture.capture(Plain(), name="p", decline=lambda ep: (_ for _ in ()).throw(
        torch._dynamo.exc.SkipFrame("skip")))
    with pytest.raises(PrecompileError, match="frame 'forward', parameter 'x': got a list"):
        cap([1, 2])


def test_tensor_default_is_an_error():
    class M(torch.nn.Module):
        def forward(self, x, bias=torch.zeros(1)):
            return x + bias

    with pytest.raises(PrecompileError, match="parameter 'bias' has a tensor default"):
        precompile_capture.capture(M(), name="m")


def test_subframe_errors():
    with pytest.raises(PrecompileError, match="sub-frame 'decoder': the model has no such sub-module"):
        precompile_capture.capture(Nested(), name="n", frames=["decoder"])

    def other(y):
        return y

    with pytest.raises(PrecompileError, match="function frame 'other' is not called by name"):
        precompile_capture.capture(Nested(), name="n", frames=[other])

    def forward(y):
        return y

    with pytest.raises(PrecompileError, match="two frames are named 'forward'"):
        precompile_capture.capture(Nested(), name="n", frames=[forward])


def test_frame_names():
    cap = precompile_capture.capture(Nested(), name="n", frames=["encoder.proj", scale])
    assert cap.frame_names == ("forward", "encoder.proj", "scale")

    def entry(x):
        return scale(x)

    cap = precompile_capture.capture(entry, name="fn", frames=[scale])
    assert cap.frame_names == ("entry", "scale")


def test_frames_of_a_module_frame_get_sanitized_paths():
    from precompile_capture.artifact import frame_dir_names

    class F:
        def __init__(self, name):
            self.name = name

    dirs = frame_dir_names([F("forward"), F("blocks.0"), F("blocks_0"), F("a/b")])
    assert dirs == {"forward": "forward", "blocks.0": "blocks_0", "blocks_0": "blocks_0_2", "a/b": "a_b"}


def test_calls_file(tmp_path):
    calls = [
        {"args": [{"tensor": {"shape": [8, 4], "dtype": "float32", "seed": 3}}], "kwargs": {"n": 2, "s": "x", "m": None}},
        {"args": [{"tensor": {"shape": [2], "dtype": "int64", "seed": 0}}, 1.5, True]},
        {"args": [{"tensor": {"values": [[1, 2], [3, 4]], "dtype": "float64"}}]},
    ]
    path = tmp_path / "calls.json"
    path.write_text(json.dumps(calls))
    loaded = load_calls(str(path))
    (a0, k0), (a1, k1), (a2, k2) = loaded
    assert a0[0].shape == (8, 4) and a0[0].dtype == torch.float32
    assert torch.equal(a0[0], load_calls(str(path))[0][0][0])  # deterministic
    assert torch.equal(a0[0], torch.randn(8, 4, generator=torch.Generator().manual_seed(3)))
    assert k0 == {"n": 2, "s": "x", "m": None}
    assert a1[0].dtype == torch.int64 and a1[1:] == [1.5, True] and k1 == {}
    assert torch.equal(a2[0], torch.tensor([[1.0, 2.0], [3.0, 4.0]], dtype=torch.float64))
    with pytest.raises(PrecompileError, match="unknown dtype 'complex64'"):
        make_tensor({"shape": [1], "dtype": "complex64"})
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"args": []}))
    with pytest.raises(PrecompileError, match="expected a non-empty list of calls"):
        load_calls(str(bad))


def test_cli_refuses_an_entry_that_falls_back_on_its_first_call(tmp_path):
    calls = tmp_path / "calls.json"
    calls.write_text(json.dumps([{"args": [{"tensor": {"shape": [8, 4]}}], "kwargs": {"n": 1}}]))
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "precompile_capture", "--model", "examples.models:make_loop",
         "--calls", str(calls), "--name", "loop", "--out", str(out), "--allow-incomplete"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 2, proc.stderr
    assert "precompile_capture: error: model 'loop': the entry frame 'forward' fell back" in proc.stderr
    assert "GRAPH_BREAK" in proc.stderr
    assert "require_complete=False does not get past it" in proc.stderr
    assert not out.exists()


def test_cli_suppresses_compile_errors_when_asked(tmp_path, monkeypatch, capsys):
    # BLOOM's dynamic variant fails in Inductor's C++ (torch 2.11): the error
    # said to pass suppress_errors=True, which the command line had no way
    # to. Here the backend fails from the second compile on (the dynamic
    # recompile), as that did.
    import precompile_capture.cli as cli

    real_capture = cli.capture

    def failing_after_first(*args, **kwargs):
        compiles = []

        def decline(ep):
            compiles.append(ep)
            if len(compiles) > 1:
                raise RuntimeError("the C++ of the dynamic variant does not compile")

        return real_capture(*args, decline=decline, **kwargs)

    monkeypatch.setattr(cli, "capture", failing_after_first)
    calls = tmp_path / "calls.json"
    calls.write_text(json.dumps([{"args": [{"tensor": {"shape": [8, 4]}}]},
                                 {"args": [{"tensor": {"shape": [4, 4]}}]}]))
    argv = ["--model", "models_for_tests:Plain", "--calls", str(calls), "--name", "plain"]
    assert cli.main(argv + ["--out", str(tmp_path / "refused")]) == 2
    err = capsys.readouterr().err
    assert "does not compile" in err and "--suppress-errors --allow-incomplete" in err, err
    assert "--static-shapes" in err
    assert not (tmp_path / "refused").exists()
    out = tmp_path / "suppressed"
    assert cli.main(argv + ["--out", str(out), "--suppress-errors", "--allow-incomplete"]) == 0
    printed, progress = capsys.readouterr()
    # What it compiles, as it goes: a long compile names its call.
    assert ("precompile_capture: frame 'forward': exporting and compiling a variant for call 0: "
            "forward(x=float32[8, 4])\n" in progress), progress
    assert re.search(r"precompile_capture: frame 'forward': forward#0 compiled in \d+\.\d s\n", progress), progress
    # The first call's variant is kept; the second's call ran eagerly.
    assert "variants: {'forward': 1}" in printed, printed
    # What requests may send, the variant's guards, is printed too.
    assert "  forward#0: x: float32[8, 4]\n" in printed, printed
    assert (out / "MANIFEST.pb").exists()


def test_a_cpp_compile_error_names_the_compilers_errors_not_its_command_line():
    # torchvision's swin_t failed in Inductor's C++ (torch 2.11): the capture
    # said "C++ compile error", the compiler's command line of several
    # thousand characters, and "Output:", cut before the compiler's errors.
    from torch._inductor.exc import CppCompileError
    from precompile_capture.compiling import CompileError

    command = ["g++", "/tmp/kernel.cpp"] + ["-D FLAG"] * 500
    output = ("/tmp/kernel.cpp: In lambda function:\n"
              "/tmp/kernel.cpp:1625:56: error: 'decltype' evaluates to 'float', which is not a class\n"
              " 1625 |   return decltype(tmp328)::blendv(tmp329, tmp328, mask);\n"
              "/tmp/kernel.cpp:1693:56: error: 'decltype' evaluates to 'float', which is not a class\n")
    error = CompileError("AOTInductor compile", CppCompileError(command, output))
    assert str(error) == (
        "AOTInductor compile failed: CppCompileError: C++ compile error\n"
        "/tmp/kernel.cpp:1625:56: error: 'decltype' evaluates to 'float', which is not a class\n"
        "/tmp/kernel.cpp:1693:56: error: 'decltype' evaluates to 'float', which is not a class")
    # Other errors keep their first lines.
    assert str(CompileError("export", ValueError("one\ntwo\nthree\nfour\nfive"))) == (
        "export failed: ValueError: one\ntwo\nthree\nfour")
