"""The runtime image's contents, built here without a container engine:
deploy/stage_runtime.sh lays out the server and its torch libraries as the
Dockerfile's builder stage does; the staged server must then load only what is
staged or comes from the Debian packages the runtime stage installs, serve an
example artifact from that layout, and behave on SIGTERM as the Kubernetes
probes and grace period expect (deploy/k8s), with TLS too (the tls
component): HTTPS probes as the kubelet sends them.
"""

import http.client
import os
import re
import signal
import shutil
import ssl
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


def packages_owning_name(name):
    """The Debian packages that own a file `name` in a system library
    directory, under that name: a link only a -dev package provides (the
    unversioned libfoo.so) counts as that package's, not the library's."""
    owners = set()
    for directory in ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib", "/usr/lib"):
        path = os.path.join(directory, name)
        if not os.path.lexists(path):
            continue
        r = subprocess.run(["dpkg-query", "-S", path], capture_output=True, text=True)
        if r.returncode == 0:
            for line in r.stdout.splitlines():  # "pkg:arch[, pkg:arch]: path"
                owners |= {p.strip().split(":")[0] for p in line.rsplit(": ", 1)[0].split(",")}
    return owners


def check_dlopened_by_name(debug_output, staged):
    """LD_DEBUG=files output: every library opened with dlopen by a bare name
    is staged or comes from a package the runtime stage installs, under that
    very name. ldd cannot see these: no NEEDED entry names them."""
    if not shutil.which("dpkg-query"):
        return
    staged_names = {p.name for p in staged.rglob("*")}
    problems = []
    for path in debug_output:
        for name, loader in set(re.findall(r"file=([^/\s]+) \[\d+\];\s+dynamically loaded by (\S+)",
                                           path.read_text())):
            if name in staged_names:
                continue
            owners = packages_owning_name(name)
            if not owners & allowed_packages():
                problems.append(f"{loader} opens {name} with dlopen: here it comes from {sorted(owners)}, "
                                f"which the runtime stage of deploy/Dockerfile does not install")
    assert not problems, "\n".join(problems)


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


def unresolved_libraries(binary, staged, allowed):
    """ldd of `binary` with an empty environment, as in the image: a line per
    library that is neither staged nor from a Debian package in `allowed`."""
    out = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, env={}, check=True).stdout
    problems = []
    for line in out.splitlines():
        m = re.match(r"\s*(\S+) => (.+?) \(0x", line)
        if "not found" in line:
            problems.append(f"{binary.name}: {line.strip()}")
            continue
        if not m:
            continue
        name, path = m.groups()
        real = os.path.realpath(path)
        if real.startswith(str(staged.resolve()) + os.sep):
            continue
        if not real.startswith(SYSTEM_DIRS):
            problems.append(f"{binary.name}: {name} resolves to {real}: neither staged nor a system library")
            continue
        package = dpkg_package(path)
        if package is None:
            problems.append(f"{binary.name}: {name} ({real}) belongs to no Debian package")
        elif package.split(":")[0] not in allowed:
            problems.append(f"{binary.name}: {name} comes from the Debian package {package}, which the "
                            f"image's stages of deploy/Dockerfile do not install")
    return problems


def test_libraries_resolve_in_the_image(staged):
    """Every library the server loads is staged or belongs to a Debian
    package the runtime stage installs."""
    if not shutil.which("dpkg-query"):
        pytest.skip("not a Debian machine")
    problems = unresolved_libraries(staged / "bin/precompile_server", staged, allowed_packages())
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
        + ["--listen_address=127.0.0.1", "--grpc_port=0", "--http_port=0", "--metrics_port=-1",
           f"--shutdown_delay_seconds={delay}", "--drain_timeout_seconds=5"]
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


TLS_SECRET = "precompile-serve-tls"


def make_certificates(secret, client):
    """The Secret's files, made with the openssl CLI: a self-signed server
    certificate for 127.0.0.1 (tls.crt, tls.key) and a CA (ca.crt); in
    `client`, a client certificate that CA signed."""
    assert shutil.which("openssl"), "no openssl command (tools/setup.sh installs it)"

    def openssl(*args):
        r = subprocess.run(["openssl", *map(str, args)], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, f"openssl {' '.join(map(str, args))}:\n{r.stderr}"

    new_key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    openssl("req", "-x509", *new_key, "-days", "1", "-keyout", secret / "tls.key", "-out", secret / "tls.crt",
            "-subj", "/CN=precompile-serve", "-addext", "subjectAltName=IP:127.0.0.1")
    openssl("req", "-x509", *new_key, "-days", "1", "-keyout", client / "ca.key", "-out", secret / "ca.crt",
            "-subj", "/CN=precompile-serve test CA")
    openssl("req", "-new", *new_key, "-keyout", client / "client.key", "-out", client / "client.csr",
            "-subj", "/CN=client")
    (client / "client.ext").write_text("extendedKeyUsage=clientAuth\n")
    openssl("x509", "-req", "-in", client / "client.csr", "-CA", secret / "ca.crt", "-CAkey", client / "ca.key",
            "-CAcreateserial", "-out", client / "client.crt", "-days", "1", "-extfile", client / "client.ext")
    for path in secret.iterdir():
        path.chmod(0o440)  # as the Secret volume's defaultMode


def https_get(port, path, client_certificate=None):
    """GET https://127.0.0.1:port/path as the kubelet probes: the server's
    certificate not verified, no client certificate, HTTP/2 and HTTP/1.1
    offered, no keep-alive. Returns the status."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.set_alpn_protocols(["h2", "http/1.1"])
    if client_certificate:
        context.load_cert_chain(*client_certificate)
    connection = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=5)
    try:
        connection.request("GET", path, headers={"User-Agent": "kube-probe/1.27", "Connection": "close"})
        assert connection.sock.selected_alpn_protocol() in (None, "http/1.1"), (
            f"the server negotiated {connection.sock.selected_alpn_protocol()}, which this client cannot speak"
        )
        response = connection.getresponse()
        response.read()
        return response.status
    finally:
        connection.close()


@pytest.mark.parametrize("mutual", [False, True], ids=["tls", "mutual-tls"])
def test_https_probes_with_the_tls_component(staged, tmp_path, mutual):
    """The staged server with the cpu+tls variant's flags and certificates in
    its Secret's place (mutual-tls: the commented --tls_client_ca line of
    tls.flags uncommented) serves HTTPS only on the HTTP port: the probes'
    paths answer the kubelet's requests, /v2/health/ready 200 once the example
    is loaded and 400 from SIGTERM on while /v2/health/live stays 200; plain
    HTTP gets no answer; under mutual TLS every other path needs a client
    certificate. gRPC speaks TLS from the same files."""
    import grpc

    artifact = os.environ.get("EXAMPLE_ARTIFACT")
    if not artifact:
        pytest.skip("EXAMPLE_ARTIFACT is not set (bazel test sets it)")
    repository = tmp_path / "models"
    shutil.copytree(artifact, repository / "mlp" / "1", symlinks=False)
    secret, client = tmp_path / "tls-secret", tmp_path / "client"
    secret.mkdir()
    client.mkdir()
    make_certificates(secret, client)

    objects = lib.render("cpu+tls")
    args = lib.local_server_args(objects, lib.one(objects, "Deployment"), tmp_path, token="t0ken",
                                 secrets={TLS_SECRET: secret})
    tls_flags = tmp_path / "tls.flags"
    text = tls_flags.read_text()
    assert f"--tls_cert={secret}/tls.crt" in text and f"--tls_key={secret}/tls.key" in text, text
    if mutual:
        text, n = re.subn(r"^#\s*(--tls_client_ca=)", r"\1", text, flags=re.M)
        assert n == 1 and f"--tls_client_ca={secret}/ca.crt" in text, text
        tls_flags.write_text(text)
    delay = 2
    command = (
        [str(staged / "bin/precompile_server"), f"--model_repository={repository}"]
        + args
        + ["--listen_address=127.0.0.1", "--grpc_port=0", "--http_port=0", "--metrics_port=-1",
           f"--shutdown_delay_seconds={delay}", "--drain_timeout_seconds=5"]
    )
    log = tmp_path / "server.log"
    debug = tmp_path / "ld-debug"
    debug.mkdir()
    with open(log, "w") as out:
        # As in the image, no LD_LIBRARY_PATH; the loader reports what it
        # opens (LD_DEBUG changes no search).
        environment = {"LD_DEBUG": "files", "LD_DEBUG_OUTPUT": str(debug / "ld")}
        server = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=environment, cwd="/")
    try:
        listening = wait_for(
            lambda: server.poll() is not None
            or re.search(r"event=listening grpc_port=(\d+) metrics_port=\S+ http_port=(\d+)", read_log(log)),
            60, "the server to listen", log)
        assert server.poll() is None, f"the server exited {server.returncode}:\n{read_log(log)}"
        grpc_port, port = int(listening.group(1)), int(listening.group(2))
        assert port > 0

        def probe(path, certificate=None):
            try:
                return https_get(port, path, certificate)
            except (OSError, http.client.HTTPException) as e:
                try:
                    code = server.wait(timeout=1)
                    died = f"; the server died ({f'signal {-code}' if code < 0 else f'exit {code}'})"
                except subprocess.TimeoutExpired:
                    died = ""
                pytest.fail(f"GET https://127.0.0.1:{port}{path}: {e!r}{died}\nserver log:\n{read_log(log)}")

        assert probe("/v2/health/live") == 200
        wait_for(lambda: probe("/v2/health/ready") == 200, 120, "/v2/health/ready to answer 200", log)
        ready = re.search(r"event=ready models_ready=(\d+) models_failed=(\d+)", read_log(log))
        assert ready and ready.groups() == ("1", "0"), f"the example did not load:\n{read_log(log)}"

        # HTTPS only: a plaintext request gets no HTTP answer.
        plain = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        try:
            plain.request("GET", "/v2/health/live")
            status = plain.getresponse().status
        except (http.client.HTTPException, OSError):
            pass
        else:
            pytest.fail(f"plain HTTP to the HTTPS port got an answer: {status}")
        finally:
            plain.close()
        assert server.poll() is None, f"a plaintext request ended the server:\n{read_log(log)}"

        certificate = (str(client / "client.crt"), str(client / "client.key"))
        if mutual:
            assert probe("/v2") == 401, "server metadata answered without a client certificate"
            assert probe("/v2", certificate) == 200
        else:
            assert probe("/v2") == 200

        credentials = grpc.ssl_channel_credentials(
            root_certificates=(secret / "tls.crt").read_bytes(),
            private_key=(client / "client.key").read_bytes() if mutual else None,
            certificate_chain=(client / "client.crt").read_bytes() if mutual else None,
        )
        with grpc.secure_channel(f"127.0.0.1:{grpc_port}", credentials) as channel:
            assert health(channel, "") == "SERVING"

        server.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        wait_for(lambda: probe("/v2/health/ready") == 400, 1, "/v2/health/ready to answer 400", log)
        # Through the shutdown delay the server still answers: not ready, live.
        time.sleep(delay / 2)
        assert server.poll() is None, f"the server exited inside --shutdown_delay_seconds:\n{read_log(log)}"
        assert probe("/v2/health/live") == 200
        assert probe("/v2/health/ready") == 400
        code = server.wait(timeout=delay + 5 + 10)
        assert code == 0, f"exit {code} after SIGTERM:\n{read_log(log)}"
        assert time.monotonic() - signalled >= delay
        check_dlopened_by_name(sorted(debug.iterdir()), staged)
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
