"""Recapture from the server's recorded misses (precompile_capture.recapture
and --recapture), and the captured calls a manifest records.

Five AOTInductor compiles: version 1 of the MLP at batch 8 (one), its
recapture covering a missed batch 3 (two), and two refused recaptures that
compile their first replayed call before they fail (one each).
"""

import json
import os
import shutil

import pytest
import torch

import precompile_capture
import proto.artifact_pb2 as pb
from conftest import read_manifest
from examples.models import make_mlp
from precompile_capture import PrecompileError, cli
from precompile_capture.artifact import build_manifest, guards_from_proto, guards_proto
from precompile_capture.frames import Kind
from precompile_capture.guards import ArgGuard, Dim, GuardSet, SymbolRange, TensorSpec
from precompile_capture.recapturing import (_entry_misses, _Judge, call_from_signature, load_misses, parse_int_range,
                                            signature_words)


# -- helpers -------------------------------------------------------------------------------


def tensor_arg(name, shape, dtype="DTYPE_FLOAT32", device="cpu"):
    # As C++ MessageToJsonString writes it: int64 as strings, enums by name.
    return {"name": name, "tensor": {"dtype": dtype, "device": device, "shape": [str(s) for s in shape]}}


def miss(arguments, count=5, outcome="REFUSED", closest="forward#0", failing="x: size 0 is 3, expected 8"):
    return {
        "call": {"arguments": arguments},
        "count": str(count),
        "first_seen": 1767225600.5,
        "last_seen": 1767229200.25,
        "outcome": outcome,
        "closest_variant": closest,
        "failing_guard": failing,
    }


def misses_doc(signatures, **overrides):
    """A MissesResponse as the server's admin API writes it (snake_case)."""
    doc = {
        "name": "mlp",
        "version": "1",
        "model_name": "mlp",
        "torch_version": torch.__version__,
        "device": "cpu",
        "signatures_per_frame": 64,
        "frames": [{"frame": "forward", "is_entry": True, "signatures": signatures, "other_calls": "2"}],
    }
    doc.update(overrides)
    return doc


def write_json(path, doc):
    path.write_text(json.dumps(doc) if not isinstance(doc, str) else doc)
    return str(path)


def snapshot(model_dir):
    """Every path under the model directory and the bytes of every file."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(model_dir):
        rel = os.path.relpath(dirpath, model_dir)
        out[rel + "/"] = None
        for name in filenames:
            with open(os.path.join(dirpath, name), "rb") as f:
                out[os.path.join(rel, name)] = f.read()
    return out


def repository_with(version_dir, tmp_path, as_version="1"):
    """A fresh REPO/mlp holding a copy of `version_dir` as its only version."""
    model_dir = tmp_path / "REPO" / "mlp"
    model_dir.mkdir(parents=True)
    shutil.copytree(version_dir, model_dir / as_version)
    return model_dir


def covering(manifest, x):
    """The id of the entry variant whose saved guards hold for a call with x."""
    frame = next(f for f in manifest.frames if f.name == manifest.entry_frame)
    with torch.no_grad():
        for v in frame.variants:
            if guards_from_proto(v).holds([x]):
                return v.id
    return None


def words(manifest, sig):
    return signature_words(manifest.entry_frame, sig, manifest.device)


MISS_3 = miss([tensor_arg("x", [3, 4])])


# -- fixtures (the compiles) ---------------------------------------------------------------


@pytest.fixture(scope="module")
def v1(tmp_path_factory):
    """Version 1 of the MLP, captured at batch 8 (twice: one signature)."""
    out = tmp_path_factory.mktemp("v1") / "1"
    cap = precompile_capture.capture(make_mlp(), name="mlp")
    cap(torch.randn(8, 4))
    cap(torch.randn(8, 4))
    cap.save(out)
    cap.close()
    return out


@pytest.fixture(scope="module")
def recaptured(v1, tmp_path_factory):
    """REPO/mlp/1 = v1, recaptured from misses: a refused batch 3, a call
    on cuda (which a cpu artifact cannot take: not replayed), and one the
    model raises on (a client's mistake: not replayed)."""
    tmp = tmp_path_factory.mktemp("recapture")
    model_dir = repository_with(v1, tmp)
    v1_bytes = (model_dir / "1" / "MANIFEST.pb").read_bytes()
    cuda = miss([tensor_arg("x", [8, 4], device="cuda")], count=1)
    path = write_json(tmp / "misses.json", misses_doc([MISS_3, cuda, miss([tensor_arg("x", [3, 5])], count=2)]))
    report = precompile_capture.recapture(make_mlp(), model_dir, path)
    return model_dir, report, v1_bytes


# -- captured calls ------------------------------------------------------------------------


def test_a_capture_records_its_entry_calls_once_each_in_order(v1, tmp_path):
    # The saved version 1: two calls, one signature.
    m = read_manifest(v1)
    assert [words(m, s) for s in m.captured_calls] == ["forward(x: float32[8, 4])"]

    # Without a compile (the backend declines), the manifest as save() builds it.
    def fn(x: torch.Tensor, n: int = 0, alpha: float = 1.0, **extra):
        if n < 0:
            raise ValueError("n must not be negative")
        return x * alpha + n

    def decline(ep):
        raise torch._dynamo.exc.SkipFrame("no compile in this test")

    cap = precompile_capture.capture(fn, name="fn", decline=decline)
    x8, x3 = torch.randn(8, 4), torch.randn(3, 4)
    cap(x8)
    cap(x8, n=1)
    cap(torch.randn(8, 4))  # the first signature again
    cap(x3, 1, 2)  # alpha's int is a float to the guards
    cap(x3, n=1, alpha=2.0)  # so this is the previous signature again
    with pytest.raises(ValueError):
        cap(x8, n=-1)  # raised: not a call a recapture can replay
    cap(x8, scale=torch.ones(2))  # a **kwargs entry first seen here
    cap(x8, n=0)  # absent from the call, scale is None: the first signature
    m = build_manifest(cap._contents({}), str(tmp_path), {})
    cap.close()
    assert [words(m, s) for s in m.captured_calls] == [
        "fn(x: float32[8, 4], n: 0, alpha: 1.0, scale: None)",
        "fn(x: float32[8, 4], n: 1, alpha: 1.0, scale: None)",
        "fn(x: float32[3, 4], n: 1, alpha: 2.0, scale: None)",
        "fn(x: float32[8, 4], n: 0, alpha: 1.0, scale: float32[2])",
    ]
    assert m.captured_calls[2].arguments[2].scalar.WhichOneof("value") == "float_value"


# -- recapture -----------------------------------------------------------------------------


def test_recapture_writes_the_next_version_covering_the_miss(recaptured):
    model_dir, report, v1_bytes = recaptured
    # Version 2 renamed into place; no temporary directory left; v1 untouched.
    assert sorted(os.listdir(model_dir)) == ["1", "2"]
    assert (model_dir / "1" / "MANIFEST.pb").read_bytes() == v1_bytes
    m = read_manifest(model_dir / "2")
    assert m.model_name == "mlp" and m.device == "cpu"
    # Its guards cover the missed batch 3 and still the captured batch 8.
    assert covering(m, torch.randn(3, 4)) is not None
    assert covering(m, torch.randn(8, 4)) is not None
    # It records what it replayed: version 1's call, then the miss.
    assert [words(m, s) for s in m.captured_calls] == [
        "forward(x: float32[8, 4])",
        "forward(x: float32[3, 4])",
    ]
    assert report.directory == str(model_dir / "2")
    assert (report.version, report.previous_version, report.misses_version) == (2, 1, 1)
    assert (report.replayed_captured, report.replayed_extra, report.replayed_misses) == (1, 0, 1)


def test_recapture_report_says_what_covers_each_miss(recaptured):
    model_dir, report, _ = recaptured
    m = read_manifest(model_dir / "2")
    covered, cuda, rejected = report.results
    assert covered.frame == "forward" and covered.signature == "forward(x: float32[3, 4])"
    assert (covered.count, covered.outcome, covered.status) == (5, "REFUSED", "covered")
    assert covered.variant == covering(m, torch.randn(3, 4))
    assert cuda.signature == "forward(x: float32[8, 4] on cuda)"
    assert cuda.status == "not covered" and "not on 'cpu'" in cuda.detail
    assert (rejected.signature, rejected.status) == ("forward(x: float32[3, 5])", "not covered")
    assert rejected.detail == (
        "the model raises RuntimeError on it (mat1 and mat2 shapes cannot be multiplied (3x5 and 4x8)), "
        "called eagerly with values made from its signature; not replayed")
    text = report.format()
    assert f"precompile_capture: recaptured model 'mlp' as version 2: {model_dir / '2'}" in text
    assert f"forward(x: float32[3, 4]): 5 calls, REFUSED; covered by variant {covered.variant}" in text
    assert "forward(x: float32[8, 4] on cuda): 1 call, REFUSED; not covered: its tensor 'x'" in text
    assert "forward: 2 more missed call(s) whose signatures the server did not keep" in text


# -- bad input leaves the repository as it was ------------------------------------------------


def _clear_captured_calls(model_dir):
    path = model_dir / "1" / "MANIFEST.pb"
    m = pb.Manifest()
    m.ParseFromString(path.read_bytes())
    del m.captured_calls[:]
    path.write_bytes(m.SerializeToString())


BAD_MISSES = [
    ("another model", misses_doc([MISS_3], model_name="bert"), None,
     r"misses.json is from model 'bert' but .*/mlp/1 holds model 'mlp'"),
    ("another torch", misses_doc([MISS_3], torch_version="2.0.0+cu118"), None,
     r"recorded by a server running torch 2\.0\.0\+cu118 but this process runs torch " + torch.__version__.replace("+", r"\+")),
    ("another device", misses_doc([MISS_3], device="cuda"), None,
     r"is from a model on device 'cuda' but .*/mlp/1 holds one for device 'cpu'"),
    ("a newer version", misses_doc([MISS_3], version="3"), None,
     r"recorded by version 3 of 'mlp' but the newest version in .*/REPO/mlp is 1"),
    ("not json", "{\"frames\": [", None, r"misses.json is not the JSON of a precompile.v1.MissesResponse"),
    ("unknown field", {"model_name": "mlp", "calls": []}, None,
     r"misses.json is not the JSON of a precompile.v1.MissesResponse.*calls"),
    ("unknown parameter", misses_doc([miss([tensor_arg("x", [3, 4]), tensor_arg("y", [3])])]), None,
     r"frame 'forward', signature 1 \(forward\(x: float32\[3, 4\], y: float32\[3\]\)\): names parameter 'y', "
     r"which frame 'forward' does not have \(its parameters: x\)"),
    ("missing parameter", misses_doc([MISS_3, miss([])]), None,
     r"frame 'forward', signature 2 \(forward\(\)\): lacks parameter 'x' of frame 'forward', which has no default"),
    ("unknown frame", misses_doc([MISS_3]) | {"frames": [{"frame": "decoder", "signatures": [MISS_3]}]}, None,
     r"frame 'decoder' is not a frame of .*/mlp/1 \(its frames: forward\)"),
    ("no captured calls", misses_doc([MISS_3]), _clear_captured_calls,
     r"mlp/1/MANIFEST.pb records no captured calls \(version 1 was captured before .*\), .*: give the calls "
     r"version 1 was captured from with --calls"),
]


@pytest.mark.parametrize("doc,prepare,message", [b[1:] for b in BAD_MISSES], ids=[b[0] for b in BAD_MISSES])
def test_bad_misses_are_refused_and_leave_the_repository(v1, tmp_path, doc, prepare, message):
    model_dir = repository_with(v1, tmp_path)
    if prepare is not None:
        prepare(model_dir)
    before = snapshot(model_dir)
    path = write_json(tmp_path / "misses.json", doc)
    with pytest.raises(PrecompileError, match=message):
        precompile_capture.recapture(make_mlp(), model_dir, path)
    assert snapshot(model_dir) == before


def test_a_model_directory_without_versions_is_refused(tmp_path):
    model_dir = tmp_path / "REPO" / "mlp"
    (model_dir / ".recapture-abc").mkdir(parents=True)
    (model_dir / "v1").mkdir()
    path = write_json(tmp_path / "misses.json", misses_doc([MISS_3]))
    with pytest.raises(PrecompileError, match=r"REPO/mlp has no version directory"):
        precompile_capture.recapture(make_mlp(), model_dir, path)


def test_the_cli_names_the_error_and_exits_2(v1, tmp_path, capsys):
    model_dir = repository_with(v1, tmp_path)
    before = snapshot(model_dir)
    path = write_json(tmp_path / "misses.json", misses_doc([MISS_3], model_name="bert"))
    argv = ["--model", "examples.models:make_mlp", "--recapture", str(model_dir), "--misses", path]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"precompile_capture: error: the misses file {path} is from model 'bert'")
    assert snapshot(model_dir) == before
    # Malformed arguments are refused before anything is read.
    assert cli.main(argv + ["--int-range", "x=5:5"]) == 2
    assert "--int-range 'x=5:5': the range [5, 5) is empty" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        cli.main(["--model", "examples.models:make_mlp", "--recapture", str(model_dir)])
    assert e.value.code == 2
    assert "--recapture needs --misses" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        cli.main(argv + ["--static-shapes"])
    assert e.value.code == 2
    assert "--static-shapes applies to a first capture" in capsys.readouterr().err
    assert snapshot(model_dir) == before


def test_misses_the_model_rejects_alone_leave_nothing_to_recapture(v1, tmp_path):
    model_dir = repository_with(v1, tmp_path)
    before = snapshot(model_dir)
    path = write_json(tmp_path / "misses.json", misses_doc([miss([tensor_arg("x", [3, 5])])]))
    with pytest.raises(PrecompileError) as e:
        precompile_capture.recapture(make_mlp(), model_dir, path)
    msg = str(e.value)
    assert "no missed call of the entry frame 'forward' can be replayed" in msg
    assert ("forward(x: float32[3, 5]): the model raises RuntimeError on it (mat1 and mat2 shapes cannot be "
            "multiplied (3x5 and 4x8))") in msg
    assert snapshot(model_dir) == before


class Labelled(torch.nn.Module):
    """Logits, and a loss as well when labels are given (as transformers'
    heads do)."""

    def __init__(self):
        super().__init__()
        self.head = torch.nn.Linear(4, 3)

    def forward(self, x, labels=None):
        logits = self.head(x)
        if labels is None:
            return {"logits": logits}
        return {"loss": torch.nn.functional.cross_entropy(logits, labels), "logits": logits}


def test_a_miss_that_returns_other_outputs_is_not_replayed(tmp_path):
    # The server records a client's call with labels, which the example calls
    # never passed, as a miss; replayed, it would add a loss to the outputs.
    torch.manual_seed(0)
    cap = precompile_capture.capture(Labelled(), name="labelled")
    cap(torch.randn(2, 4))
    cap.save(tmp_path / "v1" / "1")
    cap.close()
    model_dir = repository_with(tmp_path / "v1" / "1", tmp_path)
    before = snapshot(model_dir)
    labels = tensor_arg("labels", [2], dtype="DTYPE_INT64")
    path = write_json(tmp_path / "misses.json", misses_doc([miss([tensor_arg("x", [2, 4]), labels])],
                                                           model_name="labelled"))
    with pytest.raises(PrecompileError) as e:
        precompile_capture.recapture(Labelled(), model_dir, path, int_ranges={"labels": (0, 3)})
    msg = str(e.value)
    assert ("forward(x: float32[2, 4], labels: int64[2]): the model returns [loss, logits] for it, where the "
            "served model returns [logits]: a served model returns the same outputs on every call; "
            "not replayed") in msg
    assert snapshot(model_dir) == before


def test_a_miss_that_sends_part_of_a_structure_is_not_replayed(tmp_path):
    # A client that leaves out one layer of a cache is refused by the server;
    # rebuilt, its call would be a cache of fewer layers, which the capture
    # refuses, ending the recapture of every other miss.
    m = pb.Manifest(entry_frame="forward", device="cpu")
    frame = m.frames.add(name="forward")
    frame.parameters.add(name="ids")
    for name in ("cache.0", "cache.1", "cache.2"):
        frame.parameters.add(name=name, structure="cache")
    none = {"name": "cache.1", "scalar": {"none": True}}
    calls = [
        [tensor_arg("ids", [1, 1]), tensor_arg("cache.0", [1, 4]), none, tensor_arg("cache.2", [1, 4])],
        [tensor_arg("ids", [1, 1]), tensor_arg("cache.0", [1, 4]), tensor_arg("cache.1", [1, 4]),
         tensor_arg("cache.2", [1, 4])],
        [tensor_arg("ids", [1, 3])],
        [tensor_arg("ids", [1, 1]), tensor_arg("cache.2", [1, 4])],
    ]
    proto, _ = load_misses(write_json(tmp_path / "misses.json", misses_doc([miss(c) for c in calls])))
    replayed, skipped = _entry_misses(proto, m)
    assert [[a.name for a in c.arguments if a.WhichOneof("value") == "tensor"] for c in replayed] == [
        ["ids", "cache.0", "cache.1", "cache.2"], ["ids"]]
    assert list(skipped.values()) == [
        "it sends 2 of the 3 tensors of 'cache', not 'cache.1': a structure's tensors are sent all or none; "
        "not replayed",
        "it sends 1 of the 3 tensors of 'cache', not 'cache.0': a structure's tensors are sent all or none; "
        "not replayed"]


def test_a_miss_past_the_size_every_variant_bounds_is_not_replayed(tmp_path):
    # Variants whose sequence ends at 128 (a position table): a client's miss
    # of 300 tokens is not run, nor is one past a bound another variant of
    # the dimension lifts.
    m = pb.Manifest(entry_frame="forward", device="cpu")
    frame = m.frames.add(name="forward")
    frame.parameters.add(name="x")
    for i, (batch, largest) in enumerate(((2, 128), (1, 64))):
        v = frame.variants.add(id=f"forward#{i}")
        dims = v.guards.add(parameter=0).tensor.dims
        dims.add(static_size=batch)
        dims.add(symbol=0, symbol_offset=1)
        v.symbols.add(symbol=0, min=2, max=largest - 1)
    proto, _ = load_misses(write_json(tmp_path / "misses.json", misses_doc(
        [miss([tensor_arg("x", shape)]) for shape in ([2, 300], [2, 100], [3, 128])])))
    replayed, skipped = _entry_misses(proto, m)
    assert [list(c.arguments[0].tensor.shape) for c in replayed] == [[2, 100], [3, 128]]
    assert list(skipped.values()) == [
        "its 'x' has 300 in dimension 1, more than 128, the most any variant takes: a table the model "
        "indexes, or a check of its own, ends there; not replayed"]
    # A variant that takes any length for the dimension: nothing is skipped.
    v = frame.variants.add(id="forward#2")
    v.guards.add(parameter=0).tensor.dims.extend([pb.DimGuard(static_size=4), pb.DimGuard(symbol=0)])
    v.symbols.add(symbol=0, min=2)
    assert len(_entry_misses(proto, m)[0]) == 3


def test_a_recapture_that_loses_coverage_is_refused(recaptured, tmp_path, capsys):
    # Version 1 here is the recaptured version: batch 8 static, then a
    # dynamic batch from the batch-3 call. With one variant allowed, the
    # replayed batch 3 is no longer covered.
    model_dir = repository_with(recaptured[0] / "2", tmp_path)
    before = snapshot(model_dir)
    dynamic = covering(read_manifest(model_dir / "1"), torch.randn(3, 4))
    path = write_json(tmp_path / "misses.json", misses_doc([miss([tensor_arg("x", [2, 8, 4])])]))
    argv = ["--model", "examples.models:make_mlp", "--recapture", str(model_dir), "--misses", path,
            "--recompile-limit", "1", "--allow-incomplete"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert (
        f"precompile_capture: error: recapture of {model_dir} would lose coverage: version 2 covers none of "
        f"forward(x: float32[3, 4]) (covered by version 1's variant {dynamic})"
    ) in err
    assert "hit recompile_limit=1" in err
    assert snapshot(model_dir) == before


# -- the pieces --------------------------------------------------------------------------------


def test_guards_read_back_from_a_manifest_are_the_captured_guards():
    guards = GuardSet(
        args=(
            ArgGuard(0, tensor=TensorSpec(torch.float16, "cuda", (Dim(symbol=0), Dim(static=4), Dim(symbol=0)))),
            ArgGuard(1, is_none=True),
            ArgGuard(2, has_value=True, value=3),
            ArgGuard(3, has_value=True, value=0.5),
            ArgGuard(4, has_value=True, value="mean"),
            ArgGuard(5, has_value=True, value=False),
            ArgGuard(6, is_none=True),
        ),
        symbols=(SymbolRange(0, 2, 64, "s77"),),
        grad_enabled=False,
        default_dtype=torch.float64,
    )
    kinds = [Kind.TENSOR, Kind.OPTIONAL_TENSOR, Kind.INT, Kind.FLOAT, Kind.STRING, Kind.BOOL, Kind.INT]
    v = pb.Variant(id="forward#0")
    guards_proto(v, guards, kinds)
    assert guards_from_proto(v) == guards
    unbounded = GuardSet(args=(), symbols=(SymbolRange(0, 2, None, "s0"),), grad_enabled=True,
                         default_dtype=torch.float32)
    v = pb.Variant(id="forward#1")
    guards_proto(v, unbounded, [])
    assert guards_from_proto(v) == unbounded


def test_calls_are_bound_as_the_signature_takes_them():
    frame = pb.Frame(name="forward")
    B = pb.Parameter.Binding
    for name, binding in [("a", B.POSITIONAL_ONLY), ("b", B.POSITIONAL_OR_KEYWORD), ("c", B.KEYWORD_ONLY),
                          ("args.0", B.VAR_POSITIONAL), ("extra", B.VAR_KEYWORD), ("gone", B.VAR_KEYWORD)]:
        p = frame.parameters.add(name=name, binding=binding)
        if binding == B.VAR_KEYWORD:
            p.default_value.none = True
    sig = pb.CallSignature()
    sig.arguments.add(name="a").tensor.CopyFrom(pb.TensorSignature(dtype=pb.DTYPE_INT64, device="cpu", shape=[2, 3]))
    sig.arguments.add(name="b").tensor.CopyFrom(pb.TensorSignature(dtype=pb.DTYPE_FLOAT32, device="cpu", shape=[4]))
    sig.arguments.add(name="c").scalar.int_value = 7
    sig.arguments.add(name="args.0").tensor.CopyFrom(pb.TensorSignature(dtype=pb.DTYPE_BOOL, device="cpu", shape=[5]))
    sig.arguments.add(name="extra").scalar.string_value = "s"
    args, kwargs = call_from_signature(sig, frame, seed=0, int_ranges={"a": (10, 13)})
    # *args entries force the parameters before them to be positional.
    assert len(args) == 3 and set(kwargs) == {"c", "extra"}  # "gone" is None: absent
    a, b, star = args
    assert a.dtype == torch.int64 and a.shape == (2, 3) and 10 <= int(a.min()) and int(a.max()) < 13
    assert b.dtype == torch.float32 and b.shape == (4,)
    assert star.dtype == torch.bool and not star.any()
    assert kwargs == {"c": 7, "extra": "s"}
    again, _ = call_from_signature(sig, frame, seed=0, int_ranges={"a": (10, 13)})
    assert torch.equal(again[1], b)  # deterministic
    # Without *args entries, a positional-or-keyword parameter goes by keyword.
    del frame.parameters[3]
    del sig.arguments[3]
    args, kwargs = call_from_signature(sig, frame, seed=0, int_ranges={})
    assert len(args) == 1 and set(kwargs) == {"b", "c", "extra"}
    assert int(args[0].max()) < 2  # the default range [0, 2)
    assert parse_int_range("input_ids=0:1000") == ("input_ids", (0, 1000))
    with pytest.raises(PrecompileError, match="expected NAME=LO:HI"):
        parse_int_range("input_ids=0-1000")


def test_each_frame_is_judged_by_its_own_guards():
    # A manifest's frame object lives only while something holds it, and the
    # next one made may take its address: as when a recapture judges version
    # N's entry frame, then version N+1's frames.
    def manifest():
        m = pb.Manifest()
        tensor = TensorSpec(torch.float32, "cpu", (Dim(static=4),))
        for name, n in [("wide", 3), ("narrow", 1)]:
            f = m.frames.add(name=name)
            for i in range(n):
                f.parameters.add(name=f"p{i}")
            guards = GuardSet(args=(ArgGuard(n - 1, tensor=tensor),), symbols=(), grad_enabled=False,
                              default_dtype=torch.float32)
            guards_proto(f.variants.add(id=f"{name}#0"), guards, [Kind.TENSOR] * n)
        return m

    def sig(n):
        s = pb.CallSignature()
        for i in range(n):
            s.arguments.add(name=f"p{i}").tensor.CopyFrom(pb.TensorSignature(dtype=pb.DTYPE_FLOAT32, device="cpu",
                                                                             shape=[4]))
        return s

    judge = _Judge()
    saved = manifest().SerializeToString()
    old = pb.Manifest.FromString(saved)
    news = [pb.Manifest.FromString(saved) for _ in range(1000)]
    three, one = sig(3), sig(1)
    wide = old.frames[0]
    assert judge.covering_variant(wide, three) == "wide#0"
    freed = id(wide)
    del wide
    # Wrappers of other manifests' frames, held so that each takes a new
    # place, until one takes the judged frame's: only the judge's holding on
    # to the frames it has judged keeps that place taken.
    held = []
    for m in news:
        held.append(m.frames[1])
        if id(held[-1]) == freed:
            break
    assert judge.covering_variant(held[-1], one) == "narrow#0"
