"""Debian's C++ libraries as local Bazel repositories.

Each repository is one `cc_library` named after the repository whose compile
and link flags come from `pkg-config`, so Bazel links exactly what Debian's
packages installed and never downloads anything. Headers stay where Debian put
them (/usr/include is on the compiler's default search path), which keeps
`#include_next` in the C++ standard library working.
"""

def _pkg_config(rctx, flag, modules):
    if not modules:
        return []
    result = rctx.execute(["pkg-config", flag] + modules)
    if result.return_code != 0:
        fail("pkg-config {} {} failed: {}\nInstall the Debian packages with tools/setup.sh.".format(
            flag,
            " ".join(modules),
            result.stderr,
        ))
    return result.stdout.strip().split(" ") if result.stdout.strip() else []

def _system_library_impl(rctx):
    for header in rctx.attr.headers:
        if not rctx.path("/usr/include/" + header).exists:
            fail("{}: /usr/include/{} is missing. Install the Debian packages with tools/setup.sh.".format(
                rctx.name,
                header,
            ))
    defines = []
    copts = []
    for flag in _pkg_config(rctx, "--cflags", rctx.attr.modules):
        if flag.startswith("-D"):
            defines.append(flag[2:])
        elif flag and not flag.startswith("-I"):
            copts.append(flag)
    linkopts = _pkg_config(rctx, "--libs", rctx.attr.modules) + rctx.attr.extra_linkopts
    rctx.file("WORKSPACE", 'workspace(name = "{}")\n'.format(rctx.name))
    rctx.file("BUILD.bazel", """\
package(default_visibility = ["//visibility:public"])

cc_library(
    name = "{name}",
    defines = {defines},
    copts = {copts},
    linkopts = {linkopts},
)
""".format(name = rctx.attr.target or rctx.name, defines = defines, copts = copts, linkopts = linkopts))

system_library = repository_rule(
    implementation = _system_library_impl,
    local = True,
    attrs = {
        "modules": attr.string_list(doc = "pkg-config module names; none for a library without one"),
        "headers": attr.string_list(doc = "headers under /usr/include that must exist"),
        "extra_linkopts": attr.string_list(doc = "libraries without a pkg-config module"),
        "target": attr.string(doc = "name of the cc_library; defaults to the repository's name"),
    },
)
