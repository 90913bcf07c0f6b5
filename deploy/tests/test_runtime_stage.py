"""The runtime image's contents, built here without a container engine:
deploy/stage_runtime.sh lays out the server and its torch libraries as the
Dockerfile's builder stage does; the staged server must then load only what is
staged or comes from the Debian packages the runtime stage installs, serve an
example artifact from that layout, and behave on SIGTERM as the Kubernetes
probes and grace period expect (deploy/k8s).
"""

import os
import re
import signal
import shutil
import subprocess
import time

import pytest

import deploy_lib as lib
import test_dockerfile

STAGE_SCRIPT = os.path.join(lib.DEPLOY, "stage_runtime.sh")
SYSTEM_DIRS = ("/lib/", "/lib64/", "/usr/lib/", "/usr/lib64/")


def server_binary():
    server = os.environ.get("PRECOMPILE_SERVER")
    if not server:
        pytest.skip("PRECOMPILE_SERVER is not set (bazel test sets it)")
    return os.path.abspath(server)


@pytest.fixture(scope="module")
def staged(tmp_path_factory):
    dest = tmp_path_factory.mktemp("staging") / "opt-precompile-serve"
    result = subprocess.run(
        [STAGE_SCRIPT, "--part=cpu", f"--binary={server_binary()}", str(dest)],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, f"stage_runtime.sh --part=cpu failed:\n{result.stdout}{result.stderr}"
    yield dest
    shutil.rmtree(dest, ignore_errors=True)  # half a GB of libtorch


def elf_dynamic(path):
    out = subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True, check=True).stdout
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[(.+?)\]", out)
    paths = re.findall(r"\((?:RUNPATH|RPATH)\)\s+Library r\w*path: \[(.*?)\]", out)
    return needed, [p for entry in paths for p in entry.split(":")]


def dpkg_package(path):
    """The Debian package that owns `path`, or None."""
    real = os.path.realpath(path)
    for candidate in (path, real, "/usr" + real if not real.startswith("/usr") else real[4:]):
        r = subprocess.run(["dpkg-query", "-S", candidate], capture_output=True, text=True)
        if r.returncode == 0:
            return r.stdout.split(":")[0].strip()
    return None


def allowed_packages():
    return set(test_dockerfile.runtime_apt_packages()) | test_dockerfile.SLIM_BASE_PACKAGES


def test_layout(staged):
    expected = [
        "bin/precompile_server",
        "torch/lib/libtorch.so",
        "torch/lib/libtorch_cpu.so",
        "torch/lib/libc10.so",
        "torch/lib/libgomp.so.1",
    ]
    for path in expected:
        assert (staged / path).is_file(), f"not staged: {path}"
    assert not (staged / "torch/lib/libtorch_cuda.so").exists(), "the CPU part carries libtorch_cuda"
    # The stand-in (bazel/torch.bzl): wraps libtorch_cpu only, never CUDA.
    needed, _ = elf_dynamic(staged / "torch/lib/libtorch.so")
    assert "libtorch_cpu.so" in needed and not any("cuda" in n for n in needed), (
        f"the staged libtorch.so is not the CPU-only stand-in (NEEDED {needed})"
    )


def test_no_build_machine_paths(staged):
    for path in staged.rglob("*"):
        if not path.is_file():
            continue
        _, run_paths = elf_dynamic(path)
        for p in run_paths:
            assert p.startswith("$ORIGIN"), (
                f"{path.relative_to(staged)} has the run path {p}: the image has no such directory"
            )


def test_libraries_resolve_in_the_image(staged):
    """ldd with an empty environment: every library is staged or belongs to a
    Debian package the runtime stage installs."""
    if not shutil.which("dpkg-query"):
        pytest.skip("not a Debian machine")
    out = subprocess.run(
        ["ldd", str(staged / "bin/precompile_server")], capture_output=True, text=True, env={}, check=True
    ).stdout
    problems = []
    allowed = allowed_packages()
    for line in out.splitlines():
        m = re.match(r"\s*(\S+) => (.+?) \(0x", line)
        if "not found" in line:
            problems.append(f"{line.strip()}")
            continue
        if not m:
            continue
        name, path = m.groups()
        real = os.path.realpath(path)
        if real.startswith(str(staged.resolve()) + os.sep):
            continue
        assert real.startswith(SYSTEM_DIRS), f"{name} resolves to {real}: neither staged nor a system library"
        package = dpkg_package(path)
        if package is None:
            problems.append(f"{name} ({real}) belongs to no Debian package")
        elif package.split(":")[0] not in allowed:
            problems.append(
                f"{name} comes from the Debian package {package}, which the runtime stage of "
                f"deploy/Dockerfile does not install"
            )
    assert not problems, "\n".join(problems)


def health(channel, service):
    """grpc.health.v1.Health/Check, without generated stubs: the request is
    field 1 (service, a string); the response field 1 (status, an enum)."""
    data = service.encode()
    request = (b"\x0a" + bytes([len(data)]) + data) if data else b""
    call = channel.unary_unary("/grpc.health.v1.Health/Check")
    response = call(request, timeout=5)
    assert response[:1] == b"\x08", f"unexpected health response {response!r}"
    return {1: "SERVING", 2: "NOT_SERVING"}.get(response[1], f"status {response[1]}")


def read_log(path):
    with open(path) as f:
        return f.read()


def wait_for(predicate, timeout, what, log):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    pytest.fail(f"timed out waiting for {what}; server log:\n{read_log(log)}")


def test_serves_from_the_staged_layout_and_drains(staged, tmp_path):
    """The staged server with the cpu overlay's flags (ports and timings made
    test-sized) loads an example, answers health "" as the probes expect, and
    on SIGTERM turns NOT_SERVING at once, keeps answering through the shutdown
    delay, and exits 0."""
    import grpc

    artifact = os.environ.get("EXAMPLE_ARTIFACT")
    if not artifact:
        pytest.skip("EXAMPLE_ARTIFACT is not set (bazel test sets it)")
    repository = tmp_path / "models"
    shutil.copytree(artifact, repository / "mlp" / "1", symlinks=False)

    objects = lib.render("cpu")
    args = lib.local_server_args(objects, lib.one(objects, "Deployment"), tmp_path, token="t0ken")
    delay = 2
    command = (
        [str(staged / "bin/precompile_server"), f"--model_repository={repository}"]
        + args
        + ["--grpc_port=0", "--metrics_port=-1", f"--shutdown_delay_seconds={delay}", "--drain_timeout_seconds=5"]
    )
    log = tmp_path / "server.log"
    with open(log, "w") as out:
        # No environment: no LD_LIBRARY_PATH, as in the image.
        server = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env={}, cwd="/")
    try:
        ready = wait_for(lambda: re.search(r"event=ready models_ready=(\d+) models_failed=(\d+)", read_log(log)),
                         120, "the server to load the repository", log)
        assert ready.groups() == ("1", "0"), f"the example did not load:\n{read_log(log)}"
        port = int(re.search(r"event=listening grpc_port=(\d+)", read_log(log)).group(1))

        # What the process maps: the staged tree, system libraries, and the
        # variants AOTInductor unpacked into /tmp.
        with open(f"/proc/{server.pid}/maps") as f:
            mapped = {line.split()[-1] for line in f if ".so" in line}
        stray = [
            m for m in mapped
            if not m.startswith((str(staged.resolve()), str(staged))) and not m.startswith(SYSTEM_DIRS + ("/tmp/",))
        ]
        assert not stray, f"the staged server loaded libraries from outside the image layout: {stray}"
        assert any(m.startswith("/tmp/") for m in mapped), (
            "no compiled variant was loaded from /tmp: the Deployment's /tmp emptyDir assumes AOTInductor unpacks there"
        )

        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            assert health(channel, "") == "SERVING"
            assert health(channel, "mlp") == "SERVING"
            # Model control needs the token from the Secret's file.
            rescan = channel.unary_unary("/precompile.v1.PrecompileAdmin/Rescan",
                                         request_serializer=lambda _: b"",
                                         response_deserializer=lambda b: b)
            with pytest.raises(grpc.RpcError) as refused:
                rescan(None, timeout=10)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
            rescan(None, timeout=10, metadata=[("authorization", "Bearer t0ken")])
            server.send_signal(signal.SIGTERM)
            signalled = time.monotonic()
            wait_for(lambda: health(channel, "") == "NOT_SERVING", 1, "health '' to turn NOT_SERVING", log)
            assert health(channel, "mlp") == "NOT_SERVING"
            # Still answering through the shutdown delay (probes see NOT_SERVING, not a refused connection).
            time.sleep(delay / 2)
            assert server.poll() is None, f"the server exited inside --shutdown_delay_seconds:\n{read_log(log)}"
            assert health(channel, "") == "NOT_SERVING"
        code = server.wait(timeout=delay + 5 + 10)
        elapsed = time.monotonic() - signalled
        assert code == 0, f"exit {code} after SIGTERM:\n{read_log(log)}"
        assert elapsed >= delay, f"exited after {elapsed:.1f} s, before --shutdown_delay_seconds={delay}"
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()


def test_cuda_part_completes_the_cpu_part():
    """--part=cuda (dry run): libtorch_cuda and everything it needs from the
    wheel, next to libtorch_cpu, and never the wheel's own libtorch.so (which
    would replace the CPU-only stand-in)."""
    binary = server_binary()
    plans = {}
    for part in ("cpu", "cuda"):
        r = subprocess.run(
            [STAGE_SCRIPT, f"--part={part}", f"--binary={binary}", "--dry-run", "/unused"],
            capture_output=True, text=True, timeout=120,
        )
        assert r.returncode == 0, f"stage_runtime.sh --part={part} --dry-run:\n{r.stderr}"
        plans[part] = dict(line.split(" -> ") for line in r.stdout.splitlines())
    cuda_targets = set(plans["cuda"].values())
    assert "torch/lib/libtorch_cuda.so" in cuda_targets
    assert "torch/lib/libtorch.so" not in cuda_targets, "the CUDA part would overwrite the CPU-only libtorch.so stand-in"
    assert not cuda_targets & set(plans["cpu"].values()), "the CUDA part copies files the CPU part has"
    staged = {os.path.basename(t): src for plan in plans.values() for src, t in plan.items()}
    # NEEDED closure of what the runtime loads for CUDA artifacts.
    todo = [n for n in ("libtorch_cuda.so", "libtorch_cuda_linalg.so", "libcaffe2_nvrtc.so")]
    seen, missing = set(), []
    system = {os.path.basename(p) for d in ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu") if os.path.isdir(d) for p in os.listdir(d)}
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        if name in staged:
            needed, _ = elf_dynamic(staged[name])
            todo += needed
        elif name in ("libc.so.6", "libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1", "libutil.so.1",
                      "ld-linux-x86-64.so.2", "libgcc_s.so.1", "libstdc++.so.6", "libz.so.1"):
            continue  # libc6, libgcc-s1, libstdc++6, zlib1g: in the image
        elif name in ("libcuda.so.1", "libnvidia-ml.so.1"):
            continue  # the driver: mounted from the node by the NVIDIA container runtime
        else:
            missing.append(name + (" (a system library here, not installed in the image)" if name in system else ""))
    assert not missing, f"libraries CUDA support needs that the image lacks: {sorted(missing)}"
