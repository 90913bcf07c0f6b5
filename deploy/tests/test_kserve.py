"""KServe's way of deploying (deploy/kserve/): the ClusterServingRuntime and the
example InferenceService match KServe's own API, and the runtime's container
runs the server as the server accepts it.

KServe's API is read from its Python SDK (kserve 0.21.0, whose models are
generated from the same OpenAPI definitions as its CRDs): tools/setup.sh puts
the package, without its dependencies (a model server's), in
.venv/kserve-sdk, and only its generated models are loaded from there.
Every field of a KServe type must be one the SDK's model declares, with the
type it declares; fields of Kubernetes types (containers, probes, resources,
metadata) are checked strictly against Kubernetes' own schemas with
kubernetes-validate, as the other manifest tests do.
"""

import functools
import importlib
import os
import subprocess
import sys
import types

import pytest
import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import deploy_lib as lib  # noqa: E402

KSERVE = os.path.join(lib.DEPLOY, "kserve")
RUNTIME = os.path.join(KSERVE, "cluster-serving-runtime.yaml")
BERT = os.path.join(KSERVE, "inference-service-bert.yaml")
SDK = os.path.join(lib.REPO, ".venv", "kserve-sdk")
SDK_VERSION = "0.21.0"


def read(path):
    with open(path) as f:
        return yaml.safe_load(f)


@functools.lru_cache(maxsize=None)
def kserve_models():
    """KServe's generated API models, without the SDK's package (whose import
    starts a model server's dependencies)."""
    if not os.path.isdir(os.path.join(SDK, f"kserve-{SDK_VERSION}.dist-info")):
        pytest.fail(f"KServe's SDK {SDK_VERSION} is not in {SDK}: run tools/setup.sh")
    package = types.ModuleType("kserve")
    package.__path__ = [os.path.join(SDK, "kserve")]
    sys.modules["kserve"] = package
    return importlib.import_module("kserve.models")


def kubernetes_errors(kind, wrapped):
    """Errors of `wrapped` (a Kubernetes object) against Kubernetes' schema."""
    import kubernetes_validate

    try:
        kubernetes_validate.validate(wrapped, kubernetes_validate.latest_version(), strict=True)
    except kubernetes_validate.ValidationError as e:
        return [f"{'.'.join(str(p) for p in e.path)}: {e.message} ({kind})"]
    return []


def in_container(field):
    return lambda value: {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
                          "spec": {"containers": [{"name": "c", "image": "i", field: value}]}}


# The Kubernetes types the manifests use, each placed where Kubernetes'
# schema checks it.
KUBERNETES_TYPES = {
    "V1ObjectMeta": lambda v: {"apiVersion": "v1", "kind": "ConfigMap", "metadata": v},
    "V1Container": lambda v: {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
                              "spec": {"containers": [v]}},
    "V1ResourceRequirements": in_container("resources"),
    "V1Probe": in_container("readinessProbe"),
    "list[V1ContainerPort]": in_container("ports"),
}
SCALARS = {"str": str, "int": int, "bool": bool}


def api_errors(value, type_name, path):
    """What in `value` KServe's API (type `type_name`) would not take."""
    if type_name in KUBERNETES_TYPES:
        return [f"{path}: {e}" for e in kubernetes_errors(type_name,
                                                           KUBERNETES_TYPES[type_name](value))]
    if type_name in SCALARS:
        ok = isinstance(value, SCALARS[type_name]) and not (
            type_name == "int" and isinstance(value, bool))
        return [] if ok else [f"{path}: {value!r} is not a {type_name}"]
    if type_name == "object":
        return []
    if type_name.startswith("list[") and type_name.endswith("]"):
        if not isinstance(value, list):
            return [f"{path}: not a list"]
        return [e for i, item in enumerate(value)
                for e in api_errors(item, type_name[5:-1], f"{path}[{i}]")]
    if type_name.startswith("dict(str, ") and type_name.endswith(")"):
        if not isinstance(value, dict):
            return [f"{path}: not a map"]
        return [e for k, v in value.items() for e in api_errors(v, type_name[10:-1], f"{path}.{k}")]
    model = getattr(kserve_models(), type_name, None)
    if model is None:
        return [f"{path}: type {type_name} is checked by neither KServe's models nor this test"]
    if not isinstance(value, dict):
        return [f"{path}: not an object ({type_name})"]
    fields = {json_name: attr for attr, json_name in model.attribute_map.items()}
    errors = []
    for key, item in value.items():
        if key not in fields:
            errors.append(f"{path}.{key}: {type_name} has no such field "
                          f"(it has {', '.join(sorted(fields))})")
            continue
        errors += api_errors(item, model.openapi_types[fields[key]], f"{path}.{key}")
    return errors


@pytest.mark.parametrize("path,type_name", [(RUNTIME, "V1alpha1ClusterServingRuntime"),
                                            (BERT, "V1beta1InferenceService")])
def test_the_manifests_match_kserve_s_api(path, type_name):
    manifest = read(path)
    model = getattr(kserve_models(), type_name)
    group_version, kind = manifest["apiVersion"], manifest["kind"]
    assert type_name.lower() == (group_version.rsplit("/", 1)[1] + kind).lower(), (
        f"{path}: {group_version} {kind} is not {type_name}")
    assert group_version.startswith("serving.kserve.io/")
    errors = api_errors(manifest, type_name, kind)
    assert not errors, f"{os.path.basename(path)}:\n" + "\n".join(errors)
    assert model.openapi_types  # the SDK's model was read, not an empty stand-in


def test_the_checker_finds_what_kserve_would_refuse():
    # A misspelt KServe field, a wrong scalar and a misspelt Kubernetes field.
    manifest = read(BERT)
    manifest["spec"]["predictor"]["model"]["storageURI"] = "gs://x"
    manifest["spec"]["predictor"]["model"]["modelFormat"]["name"] = 7
    manifest["spec"]["predictor"]["model"]["resources"]["limit"] = {"cpu": "1"}
    errors = "\n".join(api_errors(manifest, "V1beta1InferenceService", "InferenceService"))
    assert "model.storageURI: V1beta1ModelSpec has no such field" in errors
    assert "modelFormat.name: 7 is not a str" in errors
    assert "model.resources: " in errors and "limit" in errors


def runtime_container():
    runtime = read(RUNTIME)
    containers = runtime["spec"]["containers"]
    # KServe runs the container of this name as the model server.
    assert [c["name"] for c in containers] == ["kserve-container"]
    return runtime, containers[0]


def runtime_flags():
    _, container = runtime_container()
    flags = {}
    for arg in container["args"]:
        name, value = lib.split_flag(arg)
        flags[name] = value
    return flags


def test_the_runtime_serves_what_an_inference_service_asks_of_it():
    runtime, container = runtime_container()
    bert = read(BERT)["spec"]["predictor"]["model"]
    assert bert["runtime"] == runtime["metadata"]["name"]
    formats = {f["name"] for f in runtime["spec"]["supportedModelFormats"]}
    assert bert["modelFormat"]["name"] in formats
    assert bert["protocolVersion"] in runtime["spec"]["protocolVersions"]
    flags = runtime_flags()
    # KServe's storage initializer puts storageUri there; HTTP on KServe's
    # default port 8080; gRPC where the h2c port of the example points.
    assert flags["model_repository"] == "/mnt/models"
    assert flags["http_port"] == "8080"
    assert flags["grpc_port"] == "9000"
    assert "containerPort: 9000" in open(BERT).read()
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["port"] == int(flags["http_port"])
    assert container["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    assert runtime["spec"]["annotations"]["prometheus.kserve.io/port"] == flags["metrics_port"]


def test_every_runtime_flag_exists_with_a_valid_value():
    for name, value in runtime_flags().items():
        lib.check_flag(name, value)


def test_what_the_runtime_s_requests_may_hold_fits_half_its_memory_limit():
    _, container = runtime_container()
    values = {name: lib.check_flag(name, value) for name, value in runtime_flags().items()}
    held, parts = lib.requests_may_hold(values)
    limit = lib.quantity(container["resources"]["limits"]["memory"])
    assert held <= limit / 2, (
        f"{parts} may hold {held / 2**30:.2f} GiB, more than half the memory limit "
        f"({limit / 2**30:.2f} GiB)")


def test_what_the_runtime_s_model_calls_may_hold_fits_a_quarter_of_its_memory_limit():
    _, container = runtime_container()
    values = {name: lib.check_flag(name, value) for name, value in runtime_flags().items()}
    held = lib.model_calls_may_hold(values)
    limit = lib.quantity(container["resources"]["limits"]["memory"])
    assert held <= limit / 4, (
        f"model calls may hold {held / 2**30:.2f} GiB of tensors, more than a quarter of the "
        f"memory limit ({limit / 2**30:.2f} GiB)")


def test_the_real_server_accepts_the_runtime_s_command(tmp_path):
    """precompile_server with the runtime's arguments and a repository that
    does not exist gets as far as the repository check."""
    server = os.environ.get("PRECOMPILE_SERVER")
    if not server:
        pytest.skip("PRECOMPILE_SERVER is not set (bazel test sets it)")
    _, container = runtime_container()
    # The image's server binary, without the ENTRYPOINT's --model_repository.
    assert container["command"] == [lib.entrypoint("runtime")[0]]
    missing = tmp_path / "no-such-repository"
    args = [f"--model_repository={missing}" if a.startswith("--model_repository=") else a
            for a in container["args"]]
    # Ports 0: free ones, so that the check never collides with a real server.
    args = [f"--{a[2:].split('=')[0]}=0" if a.startswith(("--http_port=", "--grpc_port=",
                                                           "--metrics_port=")) else a
            for a in args]
    result = subprocess.run([server] + args, capture_output=True, text=True, timeout=60)
    output = result.stdout + result.stderr
    assert "is not a directory" in output and result.returncode == 2, (
        f"precompile_server refused the runtime's arguments (exit {result.returncode}):\n{output}")
