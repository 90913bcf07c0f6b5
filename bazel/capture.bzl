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

AOTInductor compiles C++ for every variant; its cache and precompiled headers
live in a stable directory under /tmp (TORCHINDUCTOR_CACHE_DIR, TMPDIR) so that
actions and rebuilds reuse them. That directory is outside Bazel's view by
design: it only makes compiles faster, never changes what they produce.
"""

_INDUCTOR_DIR = "/tmp/precompile-serve-inductor"

def _precompile_artifact_impl(ctx):
    out = ctx.actions.declare_directory(ctx.label.name)
    capture_lib = ctx.attr._capture
    transitive = [capture_lib[DefaultInfo].files, capture_lib[DefaultInfo].default_runfiles.files]
    for dep in ctx.attr.deps:
        transitive.append(dep[DefaultInfo].files)
        transitive.append(dep[DefaultInfo].default_runfiles.files)
    inputs = depset(direct = [ctx.file.calls] + ctx.files.srcs, transitive = transitive)

    args = ctx.actions.args()
    args.add(ctx.executable._python)
    args.add_all(["-m", "precompile_capture"])
    args.add("--model", ctx.attr.model)
    args.add("--calls", ctx.file.calls)
    args.add("--name", ctx.attr.model_name or ctx.label.name)
    args.add("--out", out.path)
    args.add("--device", ctx.attr.device)
    args.add("--recompile-limit", str(ctx.attr.recompile_limit))
    args.add("--eager", ctx.attr.eager)
    if ctx.attr.frames:
        args.add("--frames", ",".join(ctx.attr.frames))
    if ctx.attr.allow_incomplete:
        args.add("--allow-incomplete")

    # Import roots, absolute: the workspace root (the model's package), the
    # generated protos (proto/artifact_pb2.py) and the capture package.
    roots = [
        "$PWD",
        "$PWD/" + ctx.bin_dir.path,
        "$PWD/" + (capture_lib.label.workspace_root + "/" if capture_lib.label.workspace_root else "") + capture_lib.label.package,
    ]
    command = " && ".join([
        "export PYTHONPATH=\"{}\"".format(":".join(roots)),
        "export PYTHONDONTWRITEBYTECODE=1",
        "export TORCHINDUCTOR_CACHE_DIR={}/cache".format(_INDUCTOR_DIR),
        "export TMPDIR={}/tmp".format(_INDUCTOR_DIR),
        "mkdir -p \"$TORCHINDUCTOR_CACHE_DIR\" \"$TMPDIR\"",
        "exec \"$@\"",
    ])
    ctx.actions.run_shell(
        command = command,
        arguments = [args],
        inputs = inputs,
        tools = [ctx.attr._python[DefaultInfo].files_to_run],
        outputs = [out],
        use_default_shell_env = True,
        execution_requirements = {
            # The compiler cache under /tmp is shared on purpose; keep it local.
            "no-remote": "1",
        },
        mnemonic = "PrecompileCapture",
        progress_message = "Capturing precompile artifact %s (AOTInductor compiles take a while)" % ctx.label,
    )
    return [DefaultInfo(files = depset([out]), runfiles = ctx.runfiles(files = [out]))]

precompile_artifact = rule(
    implementation = _precompile_artifact_impl,
    doc = "A precompile artifact directory captured from a model on example calls.",
    attrs = {
        "model": attr.string(mandatory = True, doc = "module:factory of the model, e.g. examples.models:make_mlp"),
        "calls": attr.label(mandatory = True, allow_single_file = [".json"], doc = "JSON list of example calls"),
        "frames": attr.string_list(doc = "Sub-frames: sub-module paths or function names"),
        "model_name": attr.string(doc = "The model's name in the artifact; default: the target name"),
        "device": attr.string(default = "cpu", values = ["cpu", "cuda"]),
        "recompile_limit": attr.int(default = 8),
        "eager": attr.string(
            default = "auto",
            values = ["auto", "torchscript", "python"],
            doc = "Eager programs of flagged frames (the capture's --eager)",
        ),
        "allow_incomplete": attr.bool(default = False, doc = "Save a capture that is not complete"),
        "deps": attr.label_list(doc = "Python libraries holding the model's code"),
        "srcs": attr.label_list(allow_files = True, doc = "Other files the model's code reads"),
        "_capture": attr.label(default = Label("//capture:precompile_capture")),
        "_python": attr.label(default = Label("@torch//:python"), executable = True, cfg = "exec"),
    },
)
