"""Writes the fuzzers' seed corpus, tests/fuzz/corpus/<fuzzer>/.

The seeds are small valid inputs, most of them taken from the example
artifacts (bazel build //examples:artifacts), so that the fuzzers start from
requests, frames and manifests the server really sees. The corpus is
committed; run this again only to change it:

    bazel build //examples:artifacts //proto:python
    .venv/bin/python3 tests/fuzz/make_seeds.py

The input formats are described in tests/fuzz/fuzz_checks.h.
"""

import argparse
import hashlib
import os
import shutil
import struct
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLES = ("mlp", "loop", "branch", "nested", "blocks")
FIXTURE_FRAMES = ("forward", "encoder", "scale")


def bazel_bin():
    return subprocess.run(
        ["bazel", "info", "bazel-bin"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout.strip()


# ---------------------------------------------------------------------------
# request_decoding_fuzzer: serialized inference.ModelInferRequest
# ---------------------------------------------------------------------------


def request_seeds(inference_pb2):
    def request(*inputs, raw=None):
        r = inference_pb2.ModelInferRequest(model_name="mlp")
        for name, datatype, shape, contents in inputs:
            t = r.inputs.add(name=name, datatype=datatype, shape=shape)
            for field, values in (contents or {}).items():
                getattr(t.contents, field).extend(values)
        for blob in raw or []:
            r.raw_input_contents.append(blob)
        return r

    floats = lambda n: struct.pack("<%df" % n, *[i * 0.5 for i in range(n)])
    seeds = {
        # The mlp example's static variant: float32[8, 4], raw.
        "raw_fp32_8x4": request(("x", "FP32", [8, 4], None), raw=[floats(32)]),
        "typed_fp32_2x4": request(
            ("x", "FP32", [2, 4], {"fp32_contents": [float(i) for i in range(8)]})
        ),
        "typed_int64_scalar_and_bool": request(
            ("n", "INT64", [], {"int64_contents": [3]}),
            ("check", "BOOL", [2], {"bool_contents": [True, False]}),
        ),
        "typed_small_ints": request(
            ("a", "INT8", [3], {"int_contents": [-128, 0, 127]}),
            ("b", "INT16", [2], {"int_contents": [-32768, 32767]}),
            ("c", "UINT8", [2], {"uint_contents": [0, 255]}),
            ("d", "INT32", [1], {"int_contents": [-7]}),
        ),
        "typed_fp64_empty": request(("x", "FP64", [0, 3], {})),
        "raw_half_and_empty": request(
            ("h", "FP16", [3], None),
            ("b", "BF16", [2, 1], None),
            ("e", "INT8", [0, 5], None),
            raw=[b"\x00\x3c" * 3, b"\x80\x3f" * 2, b""],
        ),
        "raw_int64_wrong_size": request(("x", "INT64", [4], None), raw=[b"\x01" * 31]),
        "refused_negative_dim": request(("x", "FP32", [-1, 4], None), raw=[b""]),
    }
    seeds = {k: v.SerializeToString() for k, v in seeds.items()}
    # Structural mode (first byte 0): the same kinds of requests, built.
    seeds["built_raw_fp32_8x4"] = encode_request([("FP32", [8, 4], None)], raw=True)
    seeds["built_raw_three_inputs"] = encode_request(
        [("FP16", [3], None), ("INT64", [2, 2], None), ("BOOL", [0, 7], None)], raw=True)
    seeds["built_typed_int32"] = encode_request([("INT32", [2, 3], ("int", list(range(6))))])
    seeds["built_typed_fp64"] = encode_request([("FP64", [4], ("fp64", [1, 2, 3, 4]))])
    return seeds


# The structural request format (fuzz_checks.cc, BuildRequest).
DATATYPES = ["BOOL", "UINT8", "INT8", "INT16", "INT32", "INT64", "FP16", "BF16", "FP32", "FP64",
             "BYTES", "UINT64"]
INTERESTING_SIZES = [0, 1, 2, 3, 4, 8, 16, 255, 256, 4096, 65536]  # The first entries.
TYPED_FIELDS = ["bool", "int", "int64", "uint", "uint64", "fp32", "fp64"]


def encode_request(inputs, raw=False):
    """inputs: (datatype, shape, None or (typed field, values)); sizes below 105."""
    out = bytes([0, len(inputs), 1 if raw else 0])
    for datatype, shape, typed in inputs:
        out += bytes([DATATYPES.index(datatype), len(shape)])
        for d in shape:
            out += bytes([INTERESTING_SIZES.index(d) if d in INTERESTING_SIZES else 23 + d])
        if typed:
            field, values = typed
            out += bytes([1 | (TYPED_FIELDS.index(field) << 1), len(values)])
            out += b"".join(struct.pack("<q", v) for v in values)
        else:
            out += bytes([0])
        if raw:  # The exact size: filled with the bytes that follow.
            n = 1
            for d in shape:
                n *= d
            n *= {"BOOL": 1, "UINT8": 1, "INT8": 1, "INT16": 2, "FP16": 2, "BF16": 2,
                  "INT32": 4, "FP32": 4, "INT64": 8, "FP64": 8}[datatype]
            out += bytes((i * 7) & 0xFF for i in range(n))
    return out


# ---------------------------------------------------------------------------
# guard_fuzzer: u16 length, artifact::v1::Frame, then a call
# ---------------------------------------------------------------------------

KIND = {"none": 0, "tensor": 1, "bool": 2, "int": 3, "float": 4, "string": 5}
DTYPE = {"bool": 0, "uint8": 1, "int8": 2, "int16": 3, "int32": 4, "int64": 5,
         "float16": 6, "bfloat16": 7, "float32": 8, "float64": 9}


def encode_guard_call(frame_bytes, args, grad=False, default_dtype="float32"):
    """The guard fuzzer's input (fuzz_checks.h, CheckGuards)."""
    out = struct.pack("<H", len(frame_bytes)) + frame_bytes
    out += bytes([1 if grad else 0, DTYPE[default_dtype]])
    for arg in args:
        kind = arg[0]
        out += bytes([KIND[kind]])
        if kind == "tensor":
            _, dtype, shape = arg[:3]
            device = arg[3] if len(arg) > 3 else 0
            out += bytes([DTYPE[dtype], device, len(shape)])
            out += b"".join(struct.pack("<q", d) for d in shape)
        elif kind == "bool":
            out += bytes([1 if arg[1] else 0])
        elif kind == "int":
            out += struct.pack("<q", arg[1])
        elif kind == "float":
            out += struct.pack("<d", arg[1])
        elif kind == "string":
            data = arg[1].encode()
            out += bytes([len(data)]) + data
    return out


def small_frame(frame):
    """A copy of `frame` without the long texts that only explain it."""
    f = type(frame)()
    f.CopyFrom(frame)
    f.fallback_detail = f.fallback_detail[:40]
    for v in f.variants:
        v.captured_from = ""
    return f


def guard_seeds(artifact_pb2, manifests):
    seeds = {}
    # Calls that match each example frame's variant 0, and a near miss.
    calls = {
        ("mlp", "forward"): ([("tensor", "float32", [8, 4])], [("tensor", "float32", [1, 4])]),
        ("mlp", "forward#dynamic"): ([("tensor", "float32", [16, 4])], None),
        ("loop", "forward"): ([("tensor", "float32", [8, 4]), ("int", 0)],
                              [("tensor", "float32", [8, 4]), ("int", 2)]),
        ("branch", "forward"): ([("tensor", "float32", [8, 4]), ("bool", False)],
                                [("tensor", "float32", [8, 4]), ("bool", True)]),
        ("nested", "forward"): ([("tensor", "float32", [8, 4]), ("int", 0)], None),
        ("nested", "encoder"): ([("tensor", "float32", [8, 4])],
                                [("tensor", "float64", [8, 4])]),
        ("nested", "scale"): ([("tensor", "float32", [8, 6]), ("float", 2.0)],
                              [("tensor", "float32", [8, 6]), ("float", 3.0)]),
    }
    for (model, frame_name), (hit, miss) in calls.items():
        name = frame_name.split("#")[0]
        frame = next(f for f in manifests[model].frames if f.name == name)
        data = small_frame(frame).SerializeToString()
        suffix = "_" + frame_name.split("#")[1] if "#" in frame_name else ""
        seeds["%s_%s%s_hit" % (model, name, suffix)] = encode_guard_call(data, hit)
        if miss:
            seeds["%s_%s%s_miss" % (model, name, suffix)] = encode_guard_call(data, miss)

    # Every kind of guard at once: a symbol shared by two tensors, None, the
    # specialized scalars and the global state (cf. runtime/guard_program_test.cc).
    frame = artifact_pb2.Frame(name="forward")
    for p in ("x", "y", "mask", "n", "alpha", "mode", "flag"):
        frame.parameters.add(name=p)
    v = frame.variants.add(id="forward#0", package_path="frames/forward/0.pt2")
    v.global_state.grad_enabled = True
    v.global_state.default_dtype = artifact_pb2.DTYPE_FLOAT32
    v.symbols.add(symbol=7, min=2, max=64, name="s0")
    g = v.guards.add(parameter=0)
    g.tensor.dtype = artifact_pb2.DTYPE_FLOAT32
    g.tensor.device = "cpu"
    g.tensor.dims.add(symbol=7)
    g.tensor.dims.add(static_size=4)
    g = v.guards.add(parameter=1)
    g.tensor.dtype = artifact_pb2.DTYPE_INT64
    g.tensor.device = "cuda"
    g.tensor.dims.add(symbol=7)
    v.guards.add(parameter=2).tensor.is_none = True
    v.guards.add(parameter=3).equals.int_value = 5
    v.guards.add(parameter=4).equals.float_value = 0.5
    v.guards.add(parameter=5).equals.string_value = "fast"
    v.guards.add(parameter=6).equals.bool_value = True
    w = frame.variants.add(id="forward#1", package_path="frames/forward/1.pt2")
    w.CopyFrom(v)
    w.id = "forward#1"
    w.symbols[0].ClearField("max")
    data = frame.SerializeToString()
    args = [("tensor", "float32", [16, 4]), ("tensor", "int64", [16], 1), ("none",),
            ("int", 5), ("float", 0.5), ("string", "fast"), ("bool", True)]
    seeds["all_guards_hit"] = encode_guard_call(data, args, grad=True)
    seeds["all_guards_symbol_mismatch"] = encode_guard_call(
        data, [args[0], ("tensor", "int64", [8], 1)] + args[2:], grad=True)
    seeds["all_guards_grad_off"] = encode_guard_call(data, args, grad=False)

    # A relation between sizes (x.size(0) * x.size(1) == y.size(0)), held,
    # broken, and with a product past 64 bits.
    frame = artifact_pb2.Frame(name="forward")
    for p in ("x", "y"):
        frame.parameters.add(name=p)
    v = frame.variants.add(id="forward#0", package_path="frames/forward/0.pt2")
    for symbol in range(3):
        v.symbols.add(symbol=symbol, min=0, name="s%d" % symbol)
    for parameter, symbols in ((0, (0, 1)), (1, (2,))):
        g = v.guards.add(parameter=parameter)
        g.tensor.dtype = artifact_pb2.DTYPE_FLOAT32
        g.tensor.device = "cpu"
        for symbol in symbols:
            g.tensor.dims.add(symbol=symbol)
    relation = v.size_relations.add(comparison=artifact_pb2.SizeRelation.EQ,
                                    text="x.size(0)*x.size(1) == y.size(0)")
    for step in (dict(symbol=0), dict(symbol=1), dict(op=artifact_pb2.SizeProgram.MUL)):
        relation.left.steps.add(**step)
    relation.right.steps.add(symbol=2)
    data = frame.SerializeToString()
    seeds["size_relation_hit"] = encode_guard_call(
        data, [("tensor", "float32", [3, 8]), ("tensor", "float32", [24])])
    seeds["size_relation_miss"] = encode_guard_call(
        data, [("tensor", "float32", [3, 8]), ("tensor", "float32", [23])])
    seeds["size_relation_overflow"] = encode_guard_call(
        data, [("tensor", "float32", [1 << 62, 8]), ("tensor", "float32", [0])])

    # Variants that Compile refuses, beside one it accepts.
    def refused(name, edit):
        f = artifact_pb2.Frame(name="forward")
        f.parameters.add(name="x")
        ok = f.variants.add(id="forward#0")
        g = ok.guards.add(parameter=0)
        g.tensor.dtype = artifact_pb2.DTYPE_FLOAT32
        g.tensor.device = "cpu"
        g.tensor.dims.add(static_size=2)
        bad = f.variants.add()
        bad.CopyFrom(ok)
        bad.id = "forward#1"
        edit(bad, bad.guards[0].tensor)
        seeds["compile_refused_" + name] = encode_guard_call(
            f.SerializeToString(), [("tensor", "float32", [2])])

    def many_symbols(v, t):
        del t.dims[:]
        for i in range(65):
            v.symbols.add(symbol=i, min=0)
            t.dims.add(symbol=i)

    refused("too_many_symbols", many_symbols)
    refused("negative_static_size", lambda v, t: setattr(t.dims[0], "static_size", -1))
    refused("symbol_without_range", lambda v, t: setattr(t.dims[0], "symbol", 3))
    refused("empty_range", lambda v, t: (v.symbols.add(symbol=3, min=5, max=4),
                                         setattr(t.dims[0], "symbol", 3)))
    refused("unknown_device", lambda v, t: setattr(t, "device", "tpu"))
    refused("unknown_dtype", lambda v, t: setattr(t, "dtype", 0))
    refused("parameter_range", lambda v, t: setattr(v.guards[0], "parameter", 1))
    refused("empty_scalar", lambda v, t: v.guards.add(parameter=0).equals.SetInParent())

    def unbound_relation(v, t):
        relation = v.size_relations.add(comparison=artifact_pb2.SizeRelation.LE, text="s3 <= 2")
        relation.left.steps.add(symbol=3)
        relation.right.steps.add(constant=2)

    refused("relation_of_an_unbound_symbol", unbound_relation)
    return seeds


# ---------------------------------------------------------------------------
# manifest_fuzzer: MANIFEST.pb, read beside the fixture files
# ---------------------------------------------------------------------------


def fixture_content(path):
    """The content of a fixture file (fuzz_checks.cc, FixtureContent)."""
    return ("fuzz fixture: %s\n" % path).encode()


def fixture_files():
    files = ["FRAMES"]
    for frame in FIXTURE_FRAMES:
        for name in ("0.pt2", "1.pt2", "eager.pt", "python.pt"):
            files.append("frames/%s/%s" % (frame, name))
    return files


def fit_fixture(path):
    """`path` if the fixture has it; a frame the fixture lacks shares scale's files."""
    if path in fixture_files():
        return path
    parts = path.split("/")
    if len(parts) == 3 and parts[0] == "frames" and "frames/scale/" + parts[2] in fixture_files():
        return "frames/scale/" + parts[2]
    raise ValueError("the fixture (fuzz_checks.cc) has no file for '%s'" % path)


def digest(manifest, path, content_of=None):
    content = fixture_content(content_of or path)
    manifest.files.add(path=path, sha256=hashlib.sha256(content).hexdigest(),
                       size_bytes=len(content))


def manifest_seeds(artifact_pb2, manifests):
    seeds = {}
    for model, original in manifests.items():
        m = artifact_pb2.Manifest()
        m.CopyFrom(original)
        for i, f in enumerate(m.frames):
            m.frames[i].CopyFrom(small_frame(f))
        m.created_at = ""
        m.cpu_isa = "AVX2"  # What the fuzz fixture's machine supports, wherever captured.
        for frame in m.frames:
            if frame.eager_program_path:
                frame.eager_program_path = fit_fixture(frame.eager_program_path)
            if frame.HasField("python_program"):
                frame.python_program.path = fit_fixture(frame.python_program.path)
            for v in frame.variants:
                v.package_path = fit_fixture(v.package_path)
        paths = []
        for f in m.files:
            if fit_fixture(f.path) not in paths:
                paths.append(fit_fixture(f.path))
        del m.files[:]
        for p in paths:
            digest(m, p)
        seeds["ok_" + model] = m.SerializeToString()

    base = artifact_pb2.Manifest()
    base.ParseFromString(seeds["ok_mlp"])
    # A symbolic link that stays inside the artifact is accepted.
    m = artifact_pb2.Manifest()
    m.CopyFrom(base)
    digest(m, "inside", content_of="FRAMES")
    seeds["ok_link_inside"] = m.SerializeToString()
    # Paths that leave the artifact, and a directory.
    for name, path in (("escape_link", "escape/FRAMES"), ("escape_dotdot", "../outside/FRAMES"),
                       ("absolute", "/etc/passwd"), ("directory", "dir")):
        m = artifact_pb2.Manifest()
        m.CopyFrom(base)
        digest(m, path, content_of="FRAMES")
        seeds["refused_" + name] = m.SerializeToString()

    # One seed per other refusal, so that every check starts out covered.
    def refused(name, edit, start=base):
        m = artifact_pb2.Manifest()
        m.CopyFrom(start)
        edit(m)
        seeds["refused_" + name] = m.SerializeToString()

    def frame_edit(edit):
        return lambda m: edit(m.frames[0])

    refused("checksum", lambda m: setattr(m.files[0], "sha256", "0" * 64))
    refused("size", lambda m: setattr(m.files[0], "size_bytes", 1))
    refused("format_version", lambda m: setattr(m, "format_version", 1))
    refused("torch_version", lambda m: setattr(m, "torch_version", "2.10.0+cpu"))
    refused("device", lambda m: setattr(m, "device", "tpu"))
    refused("cpu_isa", lambda m: setattr(m, "cpu_isa", "AVX512"))
    refused("frames_unlisted", lambda m: m.files.remove(m.files[0]))
    refused("entry_frame", lambda m: setattr(m, "entry_frame", "missing"))
    refused("frame_no_name", lambda m: m.frames.add())
    refused("frame_twice", lambda m: m.frames.add(name="forward"))
    refused("parameter_repeated", frame_edit(lambda f: f.parameters.add(name="x")))
    refused("eager_missing", frame_edit(
        lambda f: (setattr(f, "eager_fallback", True), f.ClearField("eager_program_path"))))
    refused("eager_unlisted", frame_edit(lambda f: setattr(f, "eager_program_path", "nope.pt")))
    refused("output_repeated", frame_edit(lambda f: f.outputs.leaves.add(name="output0", is_tensor=True)))
    refused("output_count", frame_edit(lambda f: setattr(f.variants[0], "num_outputs", 2)))
    refused("no_tensor_output", frame_edit(lambda f: setattr(f.outputs.leaves[0], "is_tensor", False)))
    refused("index_range_empty", frame_edit(lambda f: setattr(f.parameters[0].index_range, "max", 0)))
    refused("variant_id_repeated", frame_edit(lambda f: setattr(f.variants[1], "id", "forward#0")))
    refused("package_unlisted", frame_edit(
        lambda f: setattr(f.variants[0], "package_path", "frames/forward/2.pt2")))
    refused("tensor_input_range", frame_edit(lambda f: f.variants[0].tensor_inputs.append(3)))
    refused("variantless_entry", frame_edit(
        lambda f: setattr(f, "variantless_entry_fallback", True)))

    # A Python eager program's refusals, from blocks (forward's misses run Python).
    python = artifact_pb2.Manifest()
    python.ParseFromString(seeds["ok_blocks"])

    def refused_python(name, edit):
        refused("python_" + name, edit, start=python)

    def forward(m):
        return next(f for f in m.frames if f.HasField("python_program"))

    refused_python("and_torchscript", lambda m: setattr(forward(m), "eager_program_path",
                                                         fit_fixture("frames/forward/eager.pt")))
    refused_python("unlisted", lambda m: setattr(forward(m).python_program, "path", "frames/forward/nope.pt"))
    refused_python("no_version", lambda m: m.python.ClearField("python_version"))
    refused_python("no_environment", lambda m: m.ClearField("python"))
    return seeds


# ---------------------------------------------------------------------------
# http2_ledger_fuzzer: one connection's HTTP/2 bytes, in chunks (CheckHttp2Ledger)
# ---------------------------------------------------------------------------


def frame(kind, flags, stream, payload=b""):
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY = 0, 1, 3, 4, 6, 7
END_STREAM, END_HEADERS, ACK = 1, 4, 1


def encode_ledger_input(max_streams, resets_per_second, chunks, preface=True, expect_ping_ack=False):
    """chunks: (from_server, clock step in 50 ms units, bytes); a chunk's
    bytes are cut into pieces of at most 255. expect_ping_ack: the front's
    GoAway has sent its PING ("goaway!!")."""
    out = bytearray([max_streams, resets_per_second, (0 if preface else 1) | (2 if expect_ping_ack else 0)])
    for from_server, step, data in chunks:
        pieces = [data[i:i + 255] for i in range(0, len(data), 255)] or [b""]
        for n, piece in enumerate(pieces):
            out += bytes([((step + 8 if n == 0 else 8) << 1) | from_server, len(piece)]) + piece
    return bytes(out)


def ledger_seeds():
    def call(stream):  # a unary call: the client's side
        return (frame(HEADERS, END_HEADERS, stream, b"\x83\x86") +
                frame(DATA, END_STREAM, stream, b"\0\0\0\0\0"))

    def answer(stream):  # the server's side, ending with trailers
        return (frame(HEADERS, END_HEADERS, stream, b"\x88") + frame(DATA, 0, stream, b"\0" * 5) +
                frame(HEADERS, END_HEADERS | END_STREAM, stream, b"\x40"))

    reset = lambda stream: frame(RST_STREAM, 0, stream, b"\0\0\0\x08")
    settings = frame(SETTINGS, 0, 0, b"\0\x03\0\0\0\x64")
    go_away_ack = frame(PING, ACK, 0, b"goaway!!")
    return {
        "unary_calls_answered": encode_ledger_input(4, 2, [
            (0, 0, settings), (1, 0, settings + frame(SETTINGS, 1, 0)),
            (0, 1, call(1) + call(3)), (1, 1, answer(1) + answer(3)), (0, 2, reset(3))]),
        "calls_reset_before_their_answers": encode_ledger_input(8, 1, [
            (0, 0, settings)] + [(0, 1, call(s) + reset(s)) for s in range(1, 12, 2)]),
        "streams_past_the_bound": encode_ledger_input(2, 0, [
            (0, 0, b"".join(call(s) for s in range(1, 9, 2)))]),
        "pings_and_trailers_open_nothing": encode_ledger_input(4, 4, [
            (0, 0, call(1)), (0, 20, frame(PING, 0, 0, b"\0" * 8) * 3),
            (0, 20, frame(HEADERS, END_HEADERS | END_STREAM, 1, b"\x40"))]),
        "frames_split_across_chunks": encode_ledger_input(0, 0, [
            (0, 0, call(1)[:4]), (0, 0, call(1)[4:13]), (0, 0, call(1)[13:] + call(3)),
            (1, 0, answer(1)[:7]), (1, 0, answer(1)[7:])]),
        "no_preface": encode_ledger_input(4, 4, [(0, 0, b"GET / HTTP/1.1\r\n\r\n")], preface=False),
        "go_away_acknowledged_while_a_call_runs": encode_ledger_input(4, 4, [
            (0, 0, settings + call(1)), (1, 0, settings + answer(1)[:20]),
            (1, 0, answer(1)[20:] + frame(GOAWAY, 0, 0, b"\x7f\xff\xff\xff\0\0\0\0") +
             frame(PING, 0, 0, b"goaway!!")),
            (0, 1, frame(PING, ACK, 0, b"12345678") + go_away_ack[:13]), (0, 0, go_away_ack[13:])],
            expect_ping_ack=True),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bazel_bin", help="default: bazel info bazel-bin")
    parser.add_argument("--out", default=os.path.join(ROOT, "tests", "fuzz", "corpus"))
    parser.add_argument("--fuzzer", help="write only this fuzzer's seeds")
    args = parser.parse_args()
    if args.fuzzer == "http2_ledger_fuzzer":  # needs nothing built
        write_seeds(args.out, {args.fuzzer: ledger_seeds()})
        return
    bin_dir = args.bazel_bin or bazel_bin()
    sys.path.insert(0, bin_dir)
    from proto import artifact_pb2, inference_pb2  # noqa: E402 (generated by Bazel)

    manifests = {}
    for model in EXAMPLES:
        m = artifact_pb2.Manifest()
        with open(os.path.join(bin_dir, "examples", model, "MANIFEST.pb"), "rb") as f:
            m.ParseFromString(f.read())
        manifests[model] = m

    corpus = {
        "request_decoding_fuzzer": request_seeds(inference_pb2),
        "guard_fuzzer": guard_seeds(artifact_pb2, manifests),
        "manifest_fuzzer": manifest_seeds(artifact_pb2, manifests),
        "http2_ledger_fuzzer": ledger_seeds(),
    }
    if args.fuzzer:
        corpus = {args.fuzzer: corpus[args.fuzzer]}
    write_seeds(args.out, corpus)


def write_seeds(out, corpus):
    for fuzzer, seeds in corpus.items():
        directory = os.path.join(out, fuzzer)
        shutil.rmtree(directory, ignore_errors=True)
        os.makedirs(directory)
        for name, data in sorted(seeds.items()):
            with open(os.path.join(directory, name), "wb") as f:
                f.write(data)
        print("%s: %d seeds in %s" % (fuzzer, len(seeds), os.path.relpath(directory, ROOT)))


if __name__ == "__main__":
    main()
