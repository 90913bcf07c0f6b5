"""The runtime-python image's contents, built here without a container
engine: deploy/stage_runtime.sh lays out the cpu, cuda and python parts into
one directory as the image's layers do; the staged server must then run a
Python eager program with the staged Python and environment alone (nothing
of the build machine's Python, its .venv or this checkout mapped), and what
that Python loads must be staged or come from the Debian packages the
runtime-python stage installs.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import urllib.request

import numpy as np
import pytest

import deploy_lib as lib
import test_dockerfile
from test_runtime_stage import (SYSTEM_DIRS, STAGE_SCRIPT, elf_dynamic, read_log, server_binary,
                                unresolved_libraries, wait_for)


@pytest.fixture(scope="module")
def staged(tmp_path_factory):
    dest = tmp_path_factory.mktemp("staging") / "opt-precompile-serve"
    for part in ("cpu", "cuda", "python"):
        # Hard links where the script can: the CUDA libraries are gigabytes.
        result = subprocess.run(
            [STAGE_SCRIPT, f"--part={part}", f"--binary={server_binary()}", f"--venv={sys.prefix}",
             f"--install_dir={dest}", "--link", str(dest)],
            capture_output=True, text=True, timeout=600,
        )
        assert result.returncode == 0, f"stage_runtime.sh --part={part} failed:\n{result.stdout}{result.stderr}"
    yield dest
    shutil.rmtree(dest, ignore_errors=True)


def python_version():
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def test_layout(staged):
    v = python_version()
    for path in ["runtime/libprecompile_python.so", f"python/bin/python{v}", f"python/lib/python{v}/os.py",
                 f"python/lib/python{v}/lib-dynload", "venv/pyvenv.cfg", "torch/lib/libtorch_python.so"]:
        assert (staged / path).exists(), f"not staged: {path}"
    config = (staged / "venv/pyvenv.cfg").read_text()
    assert re.search(rf"^home = {re.escape(str(staged))}/python/bin$", config, re.M), config
    site = staged / f"venv/lib/python{v}/site-packages"
    # torch's libraries and the CUDA ones are the parts' files, not second copies.
    assert os.path.realpath(site / "torch/lib") == os.path.realpath(staged / "torch/lib")
    assert os.path.realpath(site / "nvidia") == os.path.realpath(staged / "nvidia")
    assert (site / "torch/__init__.py").is_file() and (site / "transformers/__init__.py").is_file()
    # Nothing that names this build's tree, nor the interpreter's tests.
    assert not (site / "precompile_serve.pth").exists()
    assert not (staged / f"python/lib/python{v}/test").exists()
    # Every link stays inside the layout: one out of it would dangle in the image.
    for directory in ("python", "venv", "runtime"):
        for root, dirs, files in os.walk(staged / directory):
            for name in dirs + files:
                path = os.path.join(root, name)
                if os.path.islink(path):
                    assert os.path.realpath(path).startswith(str(staged.resolve()) + os.sep), (
                        f"{os.path.relpath(path, staged)} links out of the layout, to {os.path.realpath(path)}"
                    )
    # The CPU-only stand-in libtorch.so stays: the Python part never replaces it.
    needed, _ = elf_dynamic(staged / "torch/lib/libtorch.so")
    assert not any("cuda" in n for n in needed)


def staged_elf_files(staged):
    v = python_version()
    yield staged / "runtime/libprecompile_python.so"
    yield staged / f"python/bin/python{v}"
    yield from (staged / "python/lib").glob("libpython*.so*")
    yield from (staged / f"python/lib/python{v}/lib-dynload").glob("*.so")


def test_no_build_machine_paths(staged):
    for path in staged_elf_files(staged):
        _, run_paths = elf_dynamic(path)
        for p in run_paths:
            assert p.startswith("$ORIGIN"), f"{path.relative_to(staged)} has the run path {p}"


def test_libraries_resolve_in_the_image(staged):
    """ldd with an empty environment, for the plugin, the Python and its
    standard library's extension modules: every library is staged or comes
    from a Debian package the runtime or runtime-python stage installs."""
    if not shutil.which("dpkg-query"):
        pytest.skip("not a Debian machine")
    allowed = (set(test_dockerfile.runtime_apt_packages("runtime"))
               | set(test_dockerfile.runtime_apt_packages("runtime-python"))
               | test_dockerfile.SLIM_BASE_PACKAGES)
    problems = []
    for path in staged_elf_files(staged):
        problems += unresolved_libraries(path, staged, allowed)
    assert not problems, "\n".join(sorted(set(problems)))


def test_serves_a_python_eager_program_from_the_staged_layout(staged, tmp_path):
    """The staged server, given only the staged environment (the program
    carries the model's own code), runs blocks' misses in Python (outputs
    equal to eager PyTorch) and maps no library of the build machine's Python
    or .venv."""
    artifact = os.environ.get("BLOCKS_ARTIFACT")
    if not artifact:
        pytest.skip("BLOCKS_ARTIFACT is not set (bazel test sets it)")
    code = os.path.abspath(os.environ["MODEL_CODE"])
    sys.path.insert(0, code)
    import torch
    from examples import models

    repository = tmp_path / "models"
    shutil.copytree(artifact, repository / "blocks" / "1", symlinks=False)
    command = [str(staged / "bin/precompile_server"), f"--model_repository={repository}",
               f"--python_env={staged}/venv", "--allow_python_programs",
               "--listen_address=127.0.0.1", "--grpc_port=0", "--http_port=0",
               "--metrics_port=-1", "--drain_timeout_seconds=5"]
    log = tmp_path / "server.log"
    with open(log, "w") as out:
        # As in the image: no LD_LIBRARY_PATH, no PYTHONHOME, no PYTHONPATH.
        server = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env={}, cwd="/")
    try:
        ready = wait_for(lambda: re.search(r"event=ready models_ready=(\d+) models_failed=(\d+)", read_log(log)),
                         120, "the server to load the repository", log)
        assert ready.groups() == ("1", "0"), f"blocks did not load:\n{read_log(log)}"
        port = int(re.search(r"event=listening .*http_port=(\d+)", read_log(log)).group(1))
        x = np.random.default_rng(0).standard_normal((8, 4), dtype=np.float32)
        body = {"inputs": [{"name": "x", "shape": [8, 4], "datatype": "FP32", "data": x.ravel().tolist()}],
                "parameters": {"steps": 2}}
        request = urllib.request.Request(f"http://127.0.0.1:{port}/v2/models/blocks/infer",
                                         data=json.dumps(body).encode(), method="POST",
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as r:
            response = json.load(r)
        assert response["parameters"]["precompile_outcome"] == "eager_fallback", response
        expected = models.make_blocks()(torch.from_numpy(x), steps=2).detach().numpy()
        got = np.array(response["outputs"][0]["data"], dtype=np.float32).reshape(expected.shape)
        np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)

        with open(f"/proc/{server.pid}/maps") as f:
            mapped = {line.split()[-1] for line in f if ".so" in line}
        assert any("libpython" in m for m in mapped), "the Python program ran without libpython mapped?"
        stray = [m for m in mapped if not m.startswith((str(staged), str(staged.resolve())))
                 and not m.startswith(SYSTEM_DIRS + ("/tmp/",))]
        assert not stray, f"the staged server loaded libraries from outside the image layout: {stray}"
    finally:
        if server.poll() is None:
            server.terminate()
            server.wait(timeout=30)
