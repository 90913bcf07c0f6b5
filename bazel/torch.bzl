"""libtorch and the Python interpreter from the project's virtual environment.

Besides libtorch, the repository exposes the environment's Python for
embedding (`:python_embed`, the headers and shared libpython of the
interpreter the environment was made from: its `pyvenv.cfg` base, so that the
embedded interpreter, its standard library and the torch wheel agree) and the
environment's path (`PYTHON_ENVIRONMENT` in version.bzl), the default
environment of the server's Python plugin.

The `torch` wheel installed by tools/setup.sh carries libtorch (headers and
shared libraries); this rule exposes it as a local repository. Its include tree
also ships protobuf 3.13 (`google/`) and fmt headers that would shadow Debian's
protobuf 3.21 and fmt 9, so those two entries are left out of the tree we
expose.

The interpreter is `$PRECOMPILE_SERVE_PYTHON` when set, else `.venv/bin/python3`
in the workspace.
"""

_SHADOWING_INCLUDE_DIRS = ["google", "fmt"]

_QUERY = """
import hashlib, importlib.metadata, json, os, sys, sysconfig
import torch
installed = sorted(f"{d.metadata['Name']}=={d.version}" for d in importlib.metadata.distributions())
print(json.dumps({
    "python_version": sys.version.split()[0],
    "installed_hash": hashlib.sha256("\\n".join(installed).encode()).hexdigest(),
    "python_include": sysconfig.get_paths()["include"],
    "python_libdir": sysconfig.get_config_var("LIBDIR") or "",
    "python_library": sysconfig.get_config_var("LDLIBRARY") or "",
    "python_shared": bool(sysconfig.get_config_var("Py_ENABLE_SHARED")),
    "torch_dir": os.path.dirname(torch.__file__),
    "version": torch.__version__,
    "cxx11_abi": bool(torch._C._GLIBCXX_USE_CXX11_ABI),
    "cuda": torch.version.cuda or "",
    "prefix": sys.prefix,
}))
"""

def _torch_repository_impl(rctx):
    workspace = rctx.path(Label("@//:WORKSPACE")).dirname

    # Read through its label, the lock is watched: when it changes (and
    # tools/setup.sh installs what it pins), this rule runs again, and the
    # interpreter script below names the new environment.
    rctx.read(Label("@//:requirements.lock"))
    python = rctx.os.environ.get("PRECOMPILE_SERVE_PYTHON", "")
    if not python:
        python = str(workspace) + "/.venv/bin/python3"
    if not rctx.path(python).exists:
        fail("no Python at {}: run tools/setup.sh (or set PRECOMPILE_SERVE_PYTHON)".format(python))
    result = rctx.execute([python, "-c", _QUERY])
    if result.return_code != 0:
        fail("{} cannot import torch: {}\nRun tools/setup.sh.".format(python, result.stderr))
    info = json.decode(result.stdout.strip().splitlines()[-1])
    torch_dir = info["torch_dir"]
    lib_dir = torch_dir + "/lib"

    for entry in rctx.path(torch_dir + "/include").readdir():
        if entry.basename not in _SHADOWING_INCLUDE_DIRS:
            rctx.symlink(entry, "include/" + entry.basename)
    for library in rctx.path(lib_dir).readdir():
        if library.basename.endswith(".so") or ".so." in library.basename:
            rctx.symlink(library, "lib/" + library.basename)

    abi = "1" if info["cxx11_abi"] else "0"

    # libpython for the Python plugin. A static-only build (no shared
    # library) cannot be embedded in a plugin: the plugin is then left out.
    python_library = info["python_library"]
    embeddable = (
        info["python_shared"] and
        python_library.startswith("lib") and python_library.endswith(".so") and
        rctx.path(info["python_libdir"] + "/" + python_library).exists and
        rctx.path(info["python_include"] + "/Python.h").exists
    )
    if embeddable:
        rctx.symlink(info["python_include"], "python_include")
        python_link = python_library[len("lib"):-len(".so")]

    # Compiled variants (AOTInductor's model .so) need "libtorch.so". The
    # wheel's libtorch.so only wraps libtorch_cpu and libtorch_cuda, so a
    # process that loaded it would carry CUDA's libraries (and their static
    # TLS) even to serve CPU artifacts. This library stands in for it: same
    # name, wrapping only the CPU half. Binaries find it first on their
    # run path; CUDA support is loaded on demand (runtime/cuda_support.h).
    rctx.file("cpu_only/empty.c", "")
    result = rctx.execute([
        "gcc",
        "-shared",
        "-o",
        str(rctx.path("cpu_only/libtorch.so")),
        "-Wl,-soname,libtorch.so",
        "-Wl,--no-as-needed",
        "-L" + lib_dir,
        "-Wl,-rpath," + lib_dir,
        "-ltorch_cpu",
        "-lc10",
        str(rctx.path("cpu_only/empty.c")),
    ])
    if result.return_code != 0:
        fail("cannot build the CPU-only libtorch.so: " + result.stderr)
    cpu_only_dir = str(rctx.path("cpu_only"))

    rctx.file("WORKSPACE", 'workspace(name = "{}")\n'.format(rctx.name))
    # The interpreter, reached through a link beside the script: the script's
    # text, part of the key of every build step that runs Python (the
    # captures above all), names no path of this checkout, so a capture
    # built in one clone is found in Bazel's disk cache by the next. What the
    # environment holds is named instead, so that a changed one captures anew.
    # The link is to the directory above the interpreter's (the environment),
    # not to the interpreter: Python finds its environment from the path it
    # is started by.
    python_dir = rctx.path(python).dirname
    rctx.symlink(python_dir.dirname, "environment")
    rctx.file("python.sh", """#!/bin/sh
# Python {python_version}, torch {torch_version}; installed distributions {installed_hash}
exec "$(dirname "$(readlink -f "$0")")/environment/{bin}/{name}" "$@"
""".format(
        python_version = info["python_version"],
        torch_version = info["version"],
        installed_hash = info["installed_hash"],
        bin = python_dir.basename,
        name = rctx.path(python).basename,
    ), executable = True)
    rctx.file("version.bzl", 'TORCH_VERSION = "{}"\nTORCH_CUDA_VERSION = "{}"\nPYTHON_ENVIRONMENT = "{}"\nPYTHON_EMBEDDABLE = {}\n'.format(
        info["version"],
        info["cuda"],
        info["prefix"],
        "True" if embeddable else "False",
    ))
    python_embed = ""
    if embeddable:
        python_embed = """
# The environment's base interpreter, to embed (runtime's Python plugin).
cc_library(
    name = "python_embed",
    hdrs = glob(["python_include/**/*.h"], allow_empty = False),
    includes = ["python_include"],
    linkopts = [
        "-L{libdir}",
        "-Wl,-rpath,{libdir}",
        "-l{link}",
    ],
)
""".format(libdir = info["python_libdir"], link = python_link)
    rctx.file("BUILD.bazel", """\
package(default_visibility = ["//visibility:public"])

exports_files(["version.bzl"])

# Headers only: for code that names torch types but links elsewhere.
cc_library(
    name = "headers",
    hdrs = glob(["include/**"], allow_empty = False),
    includes = ["include", "include/torch/csrc/api/include"],
    defines = ["_GLIBCXX_USE_CXX11_ABI={abi}"],
)

# libtorch for the CPU: tensors, TorchScript and the AOTInductor package
# loader. "libtorch.so" is the CPU-only stand-in built above, found before
# the wheel's own; CUDA support is loaded at run time (runtime/cuda_support.h).
cc_library(
    name = "libtorch",
    deps = [":headers"],
    linkopts = [
        "-L{cpu_only}",
        "-Wl,-rpath,{cpu_only}",
        "-L{lib}",
        "-Wl,-rpath,{lib}",
        "-Wl,--no-as-needed",
        "-ltorch",
        "-Wl,--as-needed",
        "-ltorch_cpu",
        "-lc10",
    ],
)

exports_files(["cpu_only/libtorch.so"])

# The virtual environment's interpreter, with torch, for build steps that run
# the capture tool.
sh_binary(
    name = "python",
    srcs = ["python.sh"],
)
""".format(abi = abi, lib = lib_dir, cpu_only = cpu_only_dir) + python_embed)

torch_repository = repository_rule(
    implementation = _torch_repository_impl,
    local = True,
    environ = ["PRECOMPILE_SERVE_PYTHON"],
)
