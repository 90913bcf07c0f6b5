"""deploy/Dockerfile, checked without a container engine: every file it copies
exists in the build context (and is not ignored), every Bazel target and
configuration it builds exists, every script it runs is there, every server
flag it passes is a flag of server/main.cc, and the stages are the ones
deploy/README.md documents.
"""

import fnmatch
import glob
import json
import os
import re
import shlex
import shutil
import subprocess

import pytest

import deploy_lib as lib
from deploy_lib import REPO, dockerfile_instructions, parse_copy

STAGES = {
    # stage: base image
    "builder": "debian:12",
    "examples-builder": "builder",
    "runtime": "debian:12-slim",
    "runtime-cuda": "runtime",
    "examples": "runtime",
    "runtime-python": "runtime-cuda",
}

# Debian 12 packages of debian:12-slim that the server's libraries may come
# from without an apt-get install (essential packages).
SLIM_BASE_PACKAGES = {"libc6", "libgcc-s1"}


def instructions(stage=None, keyword=None):
    return [
        i
        for i in dockerfile_instructions()
        if (stage is None or i.stage == stage) and (keyword is None or i.keyword == keyword)
    ]


def run_commands(stage=None):
    return [i.args for i in instructions(stage, "RUN")]


def ignore_patterns():
    with open(lib.DOCKERIGNORE) as f:
        lines = [l.strip() for l in f.read().splitlines()]
    return [l for l in lines if l and not l.startswith("#")]


def ignored(path: str) -> bool:
    """Whether the ignore file drops `path` (relative to the context) or a parent of it."""
    parts = os.path.normpath(path).split(os.sep)
    for pattern in ignore_patterns():
        negate = pattern.startswith("!")
        assert not negate, "the tests do not handle '!' exceptions in Dockerfile.dockerignore"
        pattern = pattern.strip("/")
        for n in range(1, len(parts) + 1):
            prefix = "/".join(parts[:n])
            if fnmatch.fnmatchcase(prefix, pattern):
                return True
            if pattern.startswith("**/") and fnmatch.fnmatchcase(parts[n - 1], pattern[3:]):
                return True
    return False


def runtime_apt_packages(stage="runtime"):
    packages = []
    for command in run_commands(stage):
        if "apt-get install" not in command:
            continue
        words = shlex.split(command.split("apt-get install", 1)[1].split("&&")[0])
        packages += [w for w in words if not w.startswith("-")]
    return packages


def test_stages():
    seen = {}
    for i in instructions(keyword="FROM"):
        words = i.args.split()
        seen[i.stage] = words[0]
    for stage, base in STAGES.items():
        assert stage in seen, f"deploy/Dockerfile has no stage '{stage}' (the README builds --target {stage})"
        assert seen[stage] == base, f"stage {stage} is FROM {seen[stage]}, expected {base}"
    last = instructions(keyword="FROM")[-1]
    assert last.args.split()[0] == "runtime", (
        "the last stage (the default target) should be the CPU runtime image"
    )


def test_copied_files_are_in_the_context():
    stages_so_far = set()
    for i in dockerfile_instructions():
        if i.keyword == "FROM":
            stages_so_far.add(i.stage)
        if i.keyword not in ("COPY", "ADD"):
            continue
        options, sources, _ = parse_copy(i.args)
        if "from" in options:
            assert options["from"] in stages_so_far, f"{i}: --from={options['from']} is not an earlier stage"
            continue
        assert i.keyword == "COPY", f"{i}: use COPY for files of the context"
        for source in sources:
            matches = glob.glob(os.path.join(REPO, source))
            assert matches, f"{i}: {source} does not exist in the repository (the build context)"
            if source != ".":
                assert not ignored(source), f"{i}: {source} is excluded by deploy/Dockerfile.dockerignore"


def test_build_tree_is_not_sent():
    for path in (".venv", ".git", "bazel-bin", "bazel-out", "bazel-main", ".serve"):
        assert ignored(path), f"deploy/Dockerfile.dockerignore must exclude {path}"
    # What the builder needs must still be there.
    for i in instructions("builder", "RUN") + instructions("examples-builder", "RUN"):
        for path in re.findall(r"(?:tools|deploy)/[\w./-]+", i.args):
            assert not ignored(path), f"{i}: {path} is excluded by deploy/Dockerfile.dockerignore"


def test_scripts_it_runs_exist():
    for i in instructions(keyword="RUN"):
        for path in re.findall(r"(?<![\w/])((?:tools|deploy)/[\w./-]+)", i.args):
            full = os.path.join(REPO, path)
            assert os.path.isfile(full), f"{i}: runs {path}, which does not exist"
            assert os.access(full, os.X_OK), f"{i}: {path} is not executable"


def test_bazel_targets_exist():
    """Every target the Dockerfile builds is a data dependency of this test
    (deploy/BUILD.bazel), so Bazel has checked that it exists and builds."""
    named = set()
    for command in run_commands():
        if "bazel " not in command:
            continue
        named |= set(re.findall(r"(?<![\w@])(//[\w/.-]*:[\w.+-]+)", command))
    assert named, "the Dockerfile builds no Bazel target"
    checked = set(os.environ.get("DOCKERFILE_BAZEL_TARGETS", "").split())
    if not checked:
        pytest.skip("DOCKERFILE_BAZEL_TARGETS is not set (bazel test sets it)")
    if "//runtime:libprecompile_python.so" not in checked:
        named.discard("//runtime:libprecompile_python.so")  # Not buildable here: no Python to embed.
    assert named <= checked, (
        f"the Dockerfile builds {sorted(named - checked)}: add them to DOCKERFILE_BAZEL_TARGETS and "
        f"data of //deploy:dockerfile_test, so that Bazel checks they exist"
    )


def test_bazel_targets_are_declared():
    """The same, read off the BUILD files (runs outside Bazel too)."""
    for command in run_commands():
        for target in re.findall(r"(?<![\w@])//([\w/.-]*):([\w.+-]+)", command):
            package, name = target
            build = os.path.join(REPO, package, "BUILD.bazel")
            assert os.path.isfile(build), f"//{package}:{name}: no {package}/BUILD.bazel"
            with open(build) as f:
                text = f.read()
            assert re.search(r'name\s*=\s*"%s"' % re.escape(name), text), (
                f"//{package}:{name}: {package}/BUILD.bazel declares no target '{name}'"
            )


def test_bazel_configs_exist():
    with open(os.path.join(REPO, ".bazelrc")) as f:
        bazelrc = f.read()
    configs = set(re.findall(r"^\w+:(\w+)\s", bazelrc, re.M))
    used = set()
    for command in run_commands():
        used |= set(re.findall(r"--config=(\w+)", command))
    assert "opt" in used, "the server must be built with --config=opt"
    assert used <= configs, f"--config={sorted(used - configs)} is not defined in .bazelrc"


def test_builder_is_set_up_like_a_developer_machine():
    builder = " && ".join(run_commands("builder"))
    assert "tools/setup.sh" in builder, "the builder must set up as the README does (tools/setup.sh)"
    assert re.search(r"bazel build --config=opt //server:precompile_server", builder)


def test_setup_installs_what_staging_needs():
    """deploy/stage_runtime.sh runs in the builder, which is set up by
    tools/setup.sh only: patchelf must be among its Debian packages."""
    with open(os.path.join(REPO, "tools", "setup.sh")) as f:
        setup = f.read()
    packages = re.search(r"debian_packages=\((.*?)\)", setup, re.S)
    assert packages, "tools/setup.sh has no debian_packages=( ... ) list"
    assert "patchelf" in packages.group(1).split(), (
        "deploy/stage_runtime.sh needs patchelf: add it to debian_packages in tools/setup.sh"
    )


def test_server_flags_exist():
    entry = lib.entrypoint()
    assert entry[0].endswith("/precompile_server")
    args = entry[1:]
    for i in instructions(keyword="CMD"):
        value = json.loads(i.args)
        assert isinstance(value, list), f"{i}: use the exec form"
        args += value
    assert "--model_repository=/models" in entry
    for arg in args:
        parsed = lib.split_flag(arg)
        assert parsed, f"ENTRYPOINT/CMD: '{arg}' is not a --flag"
        try:
            lib.check_flag(*parsed)
        except ValueError as e:
            pytest.fail(f"deploy/Dockerfile: {e}")


def test_entrypoint_is_the_staged_server():
    entry = lib.entrypoint()[0]
    copies = []
    for i in instructions("runtime", "COPY"):
        options, sources, dest = parse_copy(i.args)
        if options.get("from") == "builder" and sources == ["/staging/cpu/"]:
            copies.append(dest)
    assert copies, "the runtime stage does not copy /staging/cpu/ from the builder"
    # deploy/stage_runtime.sh puts the server at bin/precompile_server.
    assert entry == os.path.join(copies[0], "bin/precompile_server"), (
        f"ENTRYPOINT {entry} is not where deploy/stage_runtime.sh stages the server "
        f"({copies[0]}bin/precompile_server)"
    )
    builder = " ".join(run_commands("builder"))
    assert "deploy/stage_runtime.sh --part=cpu /staging/cpu" in builder
    cuda = [parse_copy(i.args) for i in instructions("runtime-cuda", "COPY")]
    assert any(o.get("from") == "builder" and s == ["/staging/cuda/"] and d == copies[0] for o, s, d in cuda), (
        "runtime-cuda must copy /staging/cuda/ from the builder onto the same directory"
    )
    assert "deploy/stage_runtime.sh --part=cuda /staging/cuda" in builder


@pytest.mark.parametrize("stage", ["runtime", "runtime-python"])
def test_runs_as_a_numeric_non_root_user(stage):
    user = lib.image_user(stage)
    assert re.fullmatch(r"\d+(:\d+)?", user), f"USER {user}: Kubernetes can only check runAsNonRoot for a numeric user"
    assert int(user.split(":")[0]) != 0, "USER 0 is root"
    assert user == lib.image_user("runtime"), "every runtime image runs as the same user"
    # A stage that switches to root (to install packages) switches back last.
    keywords = [i.keyword for i in dockerfile_instructions() if i.stage == stage]
    assert "USER" in keywords
    last_user = len(keywords) - 1 - keywords[::-1].index("USER")
    assert not {"RUN", "COPY"} & set(keywords[last_user:]), f"stage {stage}: a RUN or COPY follows its last USER"


def test_python_image_serves_python_eager_programs():
    """runtime-python: the builder stages --part=python from the plugin it
    built, the stage copies it onto the same directory as the server, and
    the entrypoint names the staged environment (stage_runtime.sh puts it at
    venv/) and is otherwise the runtime image's."""
    builder = " ".join(run_commands("builder"))
    assert "//runtime:libprecompile_python.so" in builder, "the builder does not build the Python plugin"
    assert "deploy/stage_runtime.sh --part=python /staging/python" in builder
    runtime_dest = [d for o, s, d in (parse_copy(i.args) for i in instructions("runtime", "COPY"))
                    if s == ["/staging/cpu/"]][0]
    python = [parse_copy(i.args) for i in instructions("runtime-python", "COPY")]
    assert any(o.get("from") == "builder" and s == ["/staging/python/"] and d == runtime_dest for o, s, d in python)
    entry = lib.entrypoint("runtime-python")
    assert entry[: len(lib.entrypoint())] == lib.entrypoint(), "runtime-python changes the runtime entrypoint"
    assert f"--python_env={runtime_dest.rstrip('/')}/venv" in entry
    # Python eager programs are code: only this image loads them.
    assert "--allow_python_programs" in entry
    assert "--allow_python_programs" not in lib.entrypoint()
    for arg in entry[1:]:
        lib.check_flag(*lib.split_flag(arg))
    cmd = [json.loads(i.args) for i in instructions("runtime-python", "CMD")]
    assert cmd == [[]], "runtime-python serves on the CPU by default (runtime-cuda's CMD is --device=cuda)"


def test_exposes_the_server_ports():
    """EXPOSE documents the ports the server listens on by default."""
    exposed = set()
    for i in instructions("runtime", "EXPOSE"):
        exposed |= {int(p.split("/")[0]) for p in i.args.split()}
    flags = lib.server_flags()
    defaults = {name: flags[name].default_value() for name in ("grpc_port", "http_port", "metrics_port")}
    assert exposed == set(defaults.values()), (
        f"the runtime stage exposes {sorted(exposed)}; the server's default ports are {defaults}"
    )


def test_writable_home_and_tmp():
    env = " ".join(i.args for i in instructions("runtime", "ENV"))
    assert re.search(r"\bHOME=/tmp\b", env), "HOME must be writable under a read-only root: /tmp"


def test_cuda_image_asks_for_the_driver():
    env = " ".join(i.args for i in instructions("runtime-cuda", "ENV"))
    assert "NVIDIA_VISIBLE_DEVICES=" in env
    caps = re.search(r"NVIDIA_DRIVER_CAPABILITIES=([\w,]+)", env)
    assert caps and "compute" in caps.group(1).split(","), "the NVIDIA runtime must mount the compute libraries"


@pytest.mark.parametrize("stage", ["runtime", "runtime-python"])
def test_runtime_installs_only_runtime_packages(stage):
    packages = runtime_apt_packages(stage)
    assert packages, "the runtime stage installs no Debian packages"
    dev = [p for p in packages if p.endswith("-dev")]
    assert not dev, f"the runtime image installs development packages: {dev}"
    if not shutil.which("dpkg-query"):
        pytest.skip("not a Debian machine")
    # The builder's -dev packages depend on exactly these runtime packages, so
    # tools/setup.sh has installed them here: an unknown name is a typo.
    missing = []
    for p in packages:
        r = subprocess.run(["dpkg-query", "-W", "-f=${Status}", p], capture_output=True, text=True)
        if "ok installed" not in r.stdout:
            missing.append(p)
    assert not missing, (
        f"not installed on this Debian 12 machine, so probably not a Debian 12 package name: {missing}"
    )
