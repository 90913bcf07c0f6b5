"""precompile_artifact: capture a model into a precompile artifact at build time.

The artifact is a directory output (MANIFEST.pb, FRAMES, frames/...), written by
the capture CLI (`python -m precompile_capture`, //capture:precompile_capture)
running on the project's virtual environment (`@torch//:python`):

    load("//bazel:capture.bzl", "precompile_artifact")

    precompile_artifact(
        name = "mlp",                         # the output directory, and the model name
        model = "examples.models:make_mlp",   # module:factory, importable from the workspace root
        calls = "mlp.calls.json",             # example calls
        frames = ["encoder", "scale"],        # sub-frames (optional)
        deps = [":models"],                   # the Python sources of the model
    )

A capture does not depend on how C++ is built: it runs in the execution
configuration, once, and every configuration (plain, --config=asan,
--config=tsan) sees the same directory, bazel-bin/<package>/<name>. The
capture itself is the target `<name>.captured` (tagged manual: `//...` does not
build it on its own).

A script that captures its own models, as users write them (classes in
`__main__`, their code nowhere else), is run the same way:

    precompile_script_artifacts(
        name = "user_script",                 # bazel-bin/<package>/user_script/<artifact>
        script = "user_script.py",            # run as `python user_script.py OUT`
    )

AOTInductor compiles C++ for every variant; its cache and precompiled headers
live in a stable directory under /tmp (TORCHINDUCTOR_CACHE_DIR, TMPDIR) so that
actions and rebuilds reuse them. That directory is outside Bazel's view by
design: it only makes compiles faster, never changes what they produce.

Captures run in persistent workers (bazel/capture_worker.py, .bazelrc) that
import torch, Inductor and transformers once; each capture is a process forked
from one, which reads the capture tool and the model from the workspace, so
it captures what a new Python would.
"""

_INDUCTOR_DIR = "/tmp/precompile-serve-inductor"

def _run_capture(ctx, out, args, inputs, roots, progress):
    """Runs a capture (`args`: the capture CLI's arguments, or `--script`,
    the script and its arguments) writing the directory `out`, with the
    import roots (relative to the execution root; `roots` first, then the
    generated protos and the capture package) and the compiler caches.
    Captures run in a persistent worker (bazel/capture_worker.py: each in a
    process forked after torch is imported)."""
    capture_lib = ctx.attr._capture
    roots = roots + [
        ctx.bin_dir.path,
        (capture_lib.label.workspace_root + "/" if capture_lib.label.workspace_root else "") + capture_lib.label.package,
    ]
    startup = ctx.actions.args()
    startup.add(ctx.file._worker)
    startup.add_all(roots, before_each = "--root")
    startup.add_all([
        "PYTHONDONTWRITEBYTECODE=1",
        "TORCHINDUCTOR_CACHE_DIR={}/cache".format(_INDUCTOR_DIR),
        "TMPDIR={}/tmp".format(_INDUCTOR_DIR),
        # Inductor proves each vector ISA the CPU reports by compiling a probe
        # and loading it in a new Python; this takes the base ISAs as proven
        # (the g++ that tools/setup.sh installs builds them all), and the
        # capture loads the others' probes without importing torch
        # (capture/precompile_capture/compiling.py).
        "TORCHINDUCTOR_VEC_ISA_OK=1",
        "AOT_INDUCTOR_COMPILE_WRAPPER_OPT_LEVEL={}".format(ctx.attr.wrapper_opt_level),
    ], before_each = "--env")
    startup.add_all(["{}/cache".format(_INDUCTOR_DIR), "{}/tmp".format(_INDUCTOR_DIR)], before_each = "--directory")
    args.use_param_file("@%s", use_always = True)
    args.set_param_file_format("multiline")
    ctx.actions.run(
        executable = ctx.executable._python,
        arguments = [startup, args],
        inputs = depset(transitive = [inputs, capture_lib[DefaultInfo].files, capture_lib[DefaultInfo].default_runfiles.files]),
        tools = [ctx.file._worker],
        outputs = [out],
        use_default_shell_env = True,
        execution_requirements = {
            # The compiler cache under /tmp is shared on purpose: run it here
            # (its result may still come from Bazel's disk cache).
            "no-remote-exec": "1",
            "supports-workers": "1",
        },
        mnemonic = "PrecompileCapture",
        progress_message = progress + " (AOTInductor compiles take a while)",
    )
    return [DefaultInfo(files = depset([out]), runfiles = ctx.runfiles(files = [out]))]

def _capture_impl(ctx):
    out = ctx.actions.declare_directory(ctx.label.name)
    transitive = []
    for dep in ctx.attr.deps:
        transitive.append(dep[DefaultInfo].files)
        transitive.append(dep[DefaultInfo].default_runfiles.files)
    inputs = depset(direct = [ctx.file.calls] + ctx.files.srcs, transitive = transitive)

    args = ctx.actions.args()
    args.add("--model", ctx.attr.model)
    args.add("--calls", ctx.file.calls)
    args.add("--name", ctx.attr.model_name)
    args.add("--out", out.path)
    args.add("--device", ctx.attr.device)
    args.add("--recompile-limit", str(ctx.attr.recompile_limit))
    args.add("--eager", ctx.attr.eager)
    if ctx.attr.frames:
        args.add("--frames", ",".join(ctx.attr.frames))
    if ctx.attr.allow_incomplete:
        args.add("--allow-incomplete")
    if ctx.attr.static_shapes:
        args.add("--static-shapes")
    for limit in ctx.attr.max_sizes:
        args.add("--max-size", limit)

    return _run_capture(ctx, out, args, inputs, roots = ["."],
                        progress = "Capturing precompile artifact %s" % ctx.label)

_capture = rule(
    implementation = _capture_impl,
    doc = "A precompile artifact directory captured from a model on example calls.",
    attrs = {
        "model": attr.string(mandatory = True, doc = "module:factory of the model, e.g. examples.models:make_mlp"),
        "calls": attr.label(mandatory = True, allow_single_file = [".json"], doc = "JSON list of example calls"),
        "frames": attr.string_list(doc = "Sub-frames: sub-module paths or function names"),
        "model_name": attr.string(mandatory = True, doc = "The model's name in the artifact"),
        "device": attr.string(default = "cpu", values = ["cpu", "cuda"]),
        "recompile_limit": attr.int(default = 8),
        "eager": attr.string(
            default = "auto",
            values = ["auto", "torchscript", "python"],
            doc = "Eager programs of flagged frames (the capture's --eager)",
        ),
        "allow_incomplete": attr.bool(default = False, doc = "Save a capture that is not complete"),
        "static_shapes": attr.bool(default = False, doc = "Each new shape a static variant (--static-shapes)"),
        "max_sizes": attr.string_list(doc = "The largest sizes the variants take: NAME[.DIM]=N (--max-size)"),
        "wrapper_opt_level": attr.string(
            default = "O0",
            values = ["O0", "O1", "O2", "O3"],
            doc = "How AOTInductor optimizes each variant's wrapper, the host code that " +
                  "calls its kernels (the kernels are -O3 always). O0 halves a small " +
                  "model's compile; O1, torch's default, for benchmarks.",
        ),
        "deps": attr.label_list(doc = "Python libraries holding the model's code"),
        "srcs": attr.label_list(allow_files = True, doc = "Other files the model's code reads"),
        "_capture": attr.label(default = Label("//capture:precompile_capture")),
        "_python": attr.label(default = Label("@torch//:python"), executable = True, cfg = "exec"),
        "_worker": attr.label(default = Label("//bazel:capture_worker.py"), allow_single_file = True),
    },
)

def _script_capture_impl(ctx):
    out = ctx.actions.declare_directory(ctx.label.name)
    inputs = depset([ctx.file.script])
    args = ctx.actions.args()
    args.add("--script", ctx.file.script)
    args.add(out.path)
    # No workspace root on the path: the script is all the model's code, as a
    # user's script run as `python script.py` is.
    return _run_capture(ctx, out, args, inputs, roots = [],
                        progress = "Running capture script %s" % ctx.label)

_script_capture = rule(
    implementation = _script_capture_impl,
    doc = "The artifacts a script captures of its own models, run as `python script.py OUT`.",
    attrs = {
        "script": attr.label(mandatory = True, allow_single_file = [".py"]),
        "wrapper_opt_level": attr.string(default = "O0", values = ["O0", "O1", "O2", "O3"]),
        "_capture": attr.label(default = Label("//capture:precompile_capture")),
        "_python": attr.label(default = Label("@torch//:python"), executable = True, cfg = "exec"),
        "_worker": attr.label(default = Label("//bazel:capture_worker.py"), allow_single_file = True),
    },
)

def _artifact_impl(ctx):
    out = ctx.actions.declare_directory(ctx.label.name)
    # A copy (artifacts are a few MB): Bazel 4.2 cannot symlink a directory.
    ctx.actions.run_shell(
        command = "cp -RL \"$1\"/. \"$2\"",
        arguments = [ctx.file.captured.path, out.path],
        inputs = [ctx.file.captured],
        outputs = [out],
        mnemonic = "CopyArtifact",
        progress_message = "Copying precompile artifact %s" % ctx.label,
    )
    return [DefaultInfo(files = depset([out]), runfiles = ctx.runfiles(files = [out]))]

# The captured directory, from the execution configuration, under the
# target's own name in the configuration that asks for it.
_artifact = rule(
    implementation = _artifact_impl,
    attrs = {
        "captured": attr.label(mandatory = True, allow_single_file = True, cfg = "exec"),
    },
)

def _captured_and_copied(capture_rule, name, visibility, testonly, tags = None, **kwargs):
    """`capture_rule` as the manual target `<name>.captured`, and its output
    copied to `<name>` (with `tags`) in the configuration that asks for it."""
    capture_rule(
        name = name + ".captured",
        tags = ["manual"],
        visibility = ["//visibility:private"],
        testonly = testonly,
        **kwargs
    )
    _artifact(
        name = name,
        captured = ":" + name + ".captured",
        visibility = visibility,
        testonly = testonly,
        tags = tags,
    )

def precompile_artifact(name, model_name = None, visibility = None, testonly = None, tags = None, **kwargs):
    """A precompile artifact directory, bazel-bin/<package>/<name>.

    Args:
      name: the directory, and the model's name unless model_name says otherwise.
      model_name: the model's name in the artifact.
      visibility: of the artifact.
      testonly: of both targets.
      tags: of the artifact (["manual"]: built only when named or needed,
        not by //...).
      **kwargs: the capture's attributes (model, calls, frames, deps, srcs,
        device, recompile_limit, eager, allow_incomplete, static_shapes,
        max_sizes, wrapper_opt_level).
    """
    _captured_and_copied(_capture, name, visibility, testonly, tags, model_name = model_name or name, **kwargs)

def precompile_script_artifacts(name, script, visibility = None, testonly = None):
    """The artifacts a user's script captures, run as its users run it: as
    `__main__`, with the capture package importable and nothing of the
    workspace. The script saves each artifact into a directory of its first
    argument: bazel-bin/<package>/<name>/<artifact>.

    Args:
      name: the output directory.
      script: the script.
      visibility: of the directory.
      testonly: of both targets.
    """
    _captured_and_copied(_script_capture, name, visibility, testonly, script = script)
