"""Protocol Buffers and gRPC code generation with Debian's protoc and plugins.

Bazel 4's native proto rules would fetch protobuf's sources to build protoc;
these macros run the system `protoc` (3.21, matching Debian's libprotobuf) in
a genrule instead. Imports resolve from the workspace root, so a `.proto`
imports another as "proto/other.proto" and C++ includes "proto/other.pb.h".
"""

_PROTOC = "/usr/bin/protoc"
_GRPC_CPP_PLUGIN = "/usr/bin/grpc_cpp_plugin"
_GRPC_PYTHON_PLUGIN = "/usr/bin/grpc_python_plugin"

def _stem(src):
    return src[:-len(".proto")]

def cc_proto(name, srcs, deps = [], services = False, imports = [], **kwargs):
    """C++ messages (and gRPC services) generated from `srcs`.

    Args:
      name: the cc_library.
      srcs: .proto files of this package.
      deps: cc_proto targets whose .proto files `srcs` import.
      services: also generate gRPC service stubs.
      imports: .proto files from outside the workspace (absolute include
        roots are not allowed), as `filegroup` labels.
      **kwargs: passed to the cc_library.
    """
    outs = []
    for src in srcs:
        outs += [_stem(src) + ".pb.h", _stem(src) + ".pb.cc"]
        if services:
            outs += [_stem(src) + ".grpc.pb.h", _stem(src) + ".grpc.pb.cc"]
    grpc_flags = ""
    tools = []
    if services:
        grpc_flags = "--plugin=protoc-gen-grpc={} --grpc_out=$(GENDIR)".format(_GRPC_CPP_PLUGIN)
    proto_inputs = [d + "_srcs" for d in deps]
    native.filegroup(name = name + "_srcs", srcs = srcs + proto_inputs)
    native.genrule(
        name = name + "_gen",
        srcs = srcs + proto_inputs,
        outs = outs,
        cmd = "{protoc} -I. --cpp_out=$(GENDIR) {grpc} {files}".format(
            protoc = _PROTOC,
            grpc = grpc_flags,
            files = " ".join(["$(location {})".format(s) for s in srcs]),
        ),
        tools = tools,
    )
    native.cc_library(
        name = name,
        srcs = [o for o in outs if o.endswith(".cc")],
        hdrs = [o for o in outs if o.endswith(".h")],
        deps = deps + ["@protobuf"] + (["@grpc"] if services else []),
        **kwargs
    )

def py_proto(name, srcs, deps = [], services = False, **kwargs):
    """Python messages (and gRPC stubs) generated from `srcs`.

    The modules import each other as `proto.<stem>_pb2`, so the directory
    that holds `proto/` (the runfiles root, or `bazel-bin`) goes on sys.path.
    """
    outs = []
    for src in srcs:
        outs.append(_stem(src) + "_pb2.py")
        if services:
            outs.append(_stem(src) + "_pb2_grpc.py")
    grpc_flags = ""
    if services:
        grpc_flags = "--plugin=protoc-gen-grpc_python={} --grpc_python_out=$(GENDIR)".format(_GRPC_PYTHON_PLUGIN)
    proto_inputs = [d + "_srcs" for d in deps]
    native.filegroup(name = name + "_srcs", srcs = srcs + proto_inputs)
    native.genrule(
        name = name + "_gen",
        srcs = srcs + proto_inputs,
        outs = outs,
        cmd = "{protoc} -I. --python_out=$(GENDIR) {grpc} {files}".format(
            protoc = _PROTOC,
            grpc = grpc_flags,
            files = " ".join(["$(location {})".format(s) for s in srcs]),
        ),
    )
    native.py_library(
        name = name,
        srcs = outs,
        deps = deps,
        **kwargs
    )
