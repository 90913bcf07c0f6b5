"""A parameter passed a structure of tensors (a transformers cache, a dict or
list of tensors) becomes one input per leaf, named by its path; a dimension
may be a size symbol plus an offset (a mask one longer than a cache); an
example call may pass what an earlier one returned. No AOTInductor compile
happens here but in the last test: the decoders these exist for are served
end to end by //gallery:generation_test."""

import json

import pytest
import torch
import torch.utils._pytree as pytree

import precompile_capture
import precompile_eager
from conftest import read_manifest
from examples.models import opaque
from precompile_capture import PrecompileError
from precompile_capture.artifact import build_manifest, guards_from_proto, guards_proto
from precompile_capture.cli import load_calls, resolved
from precompile_capture.frames import Frame, Kind, Variant
from precompile_capture.guards import ArgGuard, Dim, GuardSet, SymbolRange, TensorSpec
from precompile_capture.recapturing import call_from_signature
from proto import artifact_pb2 as pb


class WithCache(torch.nn.Module):
    def forward(self, ids, cache=None, mask=None, n: int = 1):
        return ids


def _frame():
    return Frame("forward", is_entry=True, module=WithCache())


def _tensor_guard(parameter, *dims):
    return ArgGuard(parameter=parameter, tensor=TensorSpec(torch.int64, "cpu", tuple(dims)))


def test_a_structure_becomes_one_input_per_leaf_in_its_place():
    frame = _frame()
    ids, mask = torch.zeros(1, 3, dtype=torch.int64), torch.ones(1, 3, dtype=torch.int64)
    # A variant captured while the cache was None, the mask after it.
    values = frame.bind((ids,), {"mask": mask})
    assert [p.name for p in frame.params] == ["ids", "cache", "mask", "n"]
    frame.observe(values)
    guards = GuardSet(args=(_tensor_guard(0, Dim(static=1), Dim(static=3)), ArgGuard(1, is_none=True),
                            _tensor_guard(2, Dim(static=1), Dim(static=3)), ArgGuard(3, has_value=True, value=1)),
                      symbols=(), grad_enabled=False, default_dtype=torch.float32,
                      index_ranges=((2, 0, 2),))
    frame.variants.append(Variant(0, "forward#0", "", guards, [0, 2], (True,), [], "call 0", 0.0))
    frame.seen_sizes = {0: [1, 3], 2: [1, 3]}
    frame.compiled_shapes = [[(1, 3), None, (1, 3), None]]

    cache = {"key": [torch.ones(1, 2, 3)], "value": [torch.ones(1, 2, 3)]}
    values = frame.bind((ids,), {"cache": cache, "mask": torch.ones(1, 4, dtype=torch.int64)})
    assert [p.name for p in frame.params] == ["ids", "cache.key.0", "cache.value.0", "mask", "n"]
    assert [p.tree for p in frame.params] == ["", "cache", "cache", "", ""]
    assert values[1] is cache["key"][0] and values[2] is cache["value"][0]
    # The earlier variant was passed None for every leaf; what came after moved.
    v = frame.variants[0]
    assert v.guards.args[1:3] == (ArgGuard(1, is_none=True), ArgGuard(2, is_none=True))
    assert [g.parameter for g in v.guards.args] == [0, 1, 2, 3, 4]
    assert v.guards.args[4].value == 1 and v.guards.args[3].tensor is not None
    assert v.tensor_inputs == [0, 3] and v.guards.index_ranges == ((3, 0, 2),)
    assert frame.seen_sizes == {0: [1, 3], 3: [1, 3]}
    assert frame.compiled_shapes == [[(1, 3), None, None, (1, 3), None]]
    # The frame's code gets the structure back; a call without it gets None.
    args, kwargs = frame.call_arguments(values)
    # The required ids by position, the optional cache by keyword.
    assert args == [ids] and kwargs["cache"] == cache and kwargs["cache"]["key"][0] is cache["key"][0]
    _, kwargs = frame.call_arguments(frame.bind((ids,), {}))
    assert kwargs["cache"] is None


def test_a_structure_of_another_shape_is_refused():
    frame = _frame()
    ids = torch.zeros(1, 3, dtype=torch.int64)
    frame.bind((ids,), {"cache": [torch.ones(2), torch.ones(2)]})
    with pytest.raises(PrecompileError, match="parameter 'cache': this call passes a structure of 3 leaves"):
        frame.bind((ids,), {"cache": [torch.ones(2)] * 3})
    other = _frame()
    other.observe(other.bind((ids,), {"cache": torch.ones(2)}))
    with pytest.raises(PrecompileError, match="parameter 'cache': got a list but earlier calls .* made it TENSOR"):
        other.bind((ids,), {"cache": [torch.ones(2)]})


def test_a_dimension_may_be_a_symbol_plus_an_offset():
    guards = GuardSet(
        args=(ArgGuard(0, tensor=TensorSpec(torch.float32, "cpu", (Dim(symbol=0),))),
              ArgGuard(1, tensor=TensorSpec(torch.float32, "cpu", (Dim(symbol=0, offset=1),)))),
        symbols=(SymbolRange(0, 1, 127, "s0"),), grad_enabled=torch.is_grad_enabled(),
        default_dtype=torch.get_default_dtype())
    assert guards.holds([torch.ones(5), torch.ones(6)])
    assert not guards.holds([torch.ones(5), torch.ones(5)])
    assert not guards.holds([torch.ones(5), torch.ones(7)])
    assert guards.holds([torch.ones(127), torch.ones(128)])
    assert not guards.holds([torch.ones(128), torch.ones(129)])
    # Bound first by the dimension with the offset.
    swapped = GuardSet(args=(ArgGuard(0, tensor=TensorSpec(torch.float32, "cpu", (Dim(symbol=0, offset=1),))),
                             ArgGuard(1, tensor=TensorSpec(torch.float32, "cpu", (Dim(symbol=0),)))),
                       symbols=guards.symbols, grad_enabled=guards.grad_enabled, default_dtype=guards.default_dtype)
    assert swapped.holds([torch.ones(6), torch.ones(5)]) and not swapped.holds([torch.ones(1), torch.ones(0)])
    assert guards.describe(["cache", "mask"]) == "cache: float32[s0 in [1, 127]], mask: float32[s0+1]"
    # Its range in parentheses where the offset dimension comes first: not
    # a dimension of its own.
    assert swapped.describe(["mask", "cache"]) == "mask: float32[s0+1 (s0 in [1, 127])], cache: float32[s0]"
    # The manifest keeps the offset.
    v = pb.Variant(id="forward#0")
    guards_proto(v, guards, [Kind.TENSOR, Kind.TENSOR])
    assert v.guards[1].tensor.dims[0].symbol_offset == 1
    assert guards_from_proto(v) == guards


def test_a_call_may_pass_what_an_earlier_call_returned(tmp_path):
    path = tmp_path / "calls.json"
    path.write_text(json.dumps([
        {"args": [{"tensor": {"shape": [2]}}]},
        {"kwargs": {"past": {"output_of": {"call": 0, "path": "cache.1"}}}},
    ]))
    calls = load_calls(str(path))
    results = [{"cache": (torch.zeros(1), torch.ones(3))}]
    assert torch.equal(resolved(calls[1][1], results)["past"], torch.ones(3))
    path.write_text(json.dumps([{"kwargs": {"past": {"output_of": {"call": 0}}}}]))
    with pytest.raises(PrecompileError, match="names call 0, not an earlier one"):
        load_calls(str(path))
    path.write_text(json.dumps([{}, {"kwargs": {"past": {"output_of": {"call": 0, "path": "nope"}}}}]))
    with pytest.raises(PrecompileError, match="no 'nope'"):
        resolved(load_calls(str(path))[1][1], [torch.ones(1)])


def test_a_call_may_pass_a_value_a_function_makes(tmp_path):
    path = tmp_path / "calls.json"
    path.write_text(json.dumps([{"kwargs": {"cache": {"made_by": "builtins:list"}}}]))
    kwargs = load_calls(str(path))[0][1]
    first, second = resolved(kwargs, [])["cache"], resolved(kwargs, [])["cache"]
    # Made afresh each time the call runs: a model may fill what it is given.
    assert first == [] and first is not second
    path.write_text(json.dumps([{"kwargs": {"cache": {"made_by": "builtins.list"}}}]))
    with pytest.raises(PrecompileError, match='"made_by" is "pkg.module:function"'):
        load_calls(str(path))
    path.write_text(json.dumps([{"kwargs": {"cache": {"made_by": "builtins:nope"}}}]))
    with pytest.raises(PrecompileError, match="made_by 'builtins:nope'"):
        resolved(load_calls(str(path))[0][1], [])


def _encoder_decoder_cache(past=0, encoder=0, layers=2):
    from transformers import DynamicCache, EncoderDecoderCache

    cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
    for layer in range(layers if past else 0):
        cache.self_attention_cache.update(torch.rand(1, 4, past, 16), torch.rand(1, 4, past, 16), layer)
        cache.cross_attention_cache.update(torch.rand(1, 4, encoder, 16), torch.rand(1, 4, encoder, 16), layer)
    return cache


def test_an_empty_structure_is_given_again_where_its_inputs_are_absent():
    # model.generate() passes an encoder-decoder an empty cache first: no
    # inputs, but the frame's code must get an empty cache, not None.
    frame = _frame()
    ids = torch.zeros(1, 3, dtype=torch.int64)
    given = _encoder_decoder_cache()
    values = frame.bind((ids,), {"cache": given})
    assert values[1] is None
    frame.observe(values)
    _, kwargs = frame.call_arguments(values)
    assert type(kwargs["cache"]) is type(given) and kwargs["cache"] is not given
    assert pytree.tree_leaves(kwargs["cache"]) == []

    # A filled one: both caches' leaves, named by attribute.
    filled = _encoder_decoder_cache(past=1, encoder=6)
    values = frame.bind((ids,), {"cache": filled})
    assert [p.name for p in frame.params if p.tree] == [
        f"cache.{attention}.{kind}.{layer}" for attention in ("self_attention_cache", "cross_attention_cache")
        for kind in ("key_cache", "value_cache") for layer in (0, 1)]
    assert values[5] is filled.cross_attention_cache.layers[0].keys
    _, kwargs = frame.call_arguments(values)
    rebuilt = kwargs["cache"]
    assert torch.equal(rebuilt.cross_attention_cache.layers[1].values, filled.cross_attention_cache.layers[1].values)
    # As transformers builds it: both layers' encoder keys are cached.
    assert rebuilt.is_updated == {0: True, 1: True}
    # Its inputs absent again: an empty cache again.
    _, kwargs = frame.call_arguments([ids] + [None] * 8 + [None, 1])
    assert type(kwargs["cache"]) is type(given) and pytree.tree_leaves(kwargs["cache"]) == []

    # An empty structure of another kind is refused, naming the parameter.
    with pytest.raises(PrecompileError, match="parameter 'cache': this call passes an empty DynamicCache"):
        from transformers import DynamicCache

        frame.bind((ids,), {"cache": DynamicCache()})


def test_a_replayed_call_rebuilds_the_structure_from_its_leaves():
    frame = pb.Frame(name="forward")
    B = pb.Parameter.Binding
    frame.parameters.add(name="ids", binding=B.POSITIONAL_OR_KEYWORD)
    for name in ("cache.0", "cache.1"):
        frame.parameters.add(name=name, binding=B.POSITIONAL_OR_KEYWORD, structure="cache")
    spec = pytree.tree_structure([torch.ones(1), torch.ones(1)])
    frame.structures.add(parameter="cache", tree_spec=pytree.treespec_dumps(spec))
    sig = pb.CallSignature()
    for name, shape in (("ids", [1, 1]), ("cache.0", [1, 4]), ("cache.1", [1, 4])):
        sig.arguments.add(name=name).tensor.CopyFrom(pb.TensorSignature(dtype=pb.DTYPE_FLOAT32, device="cpu", shape=shape))
    _, kwargs = call_from_signature(sig, frame, seed=0, int_ranges={})
    assert set(kwargs) == {"ids", "cache"}
    assert isinstance(kwargs["cache"], list) and [t.shape for t in kwargs["cache"]] == [(1, 4), (1, 4)]
    for name in ("cache.0", "cache.1"):
        sig.arguments[[a.name for a in sig.arguments].index(name)].scalar.none = True
    _, kwargs = call_from_signature(sig, frame, seed=0, int_ranges={})
    assert kwargs["cache"] is None


def test_a_replayed_call_passes_the_empty_structure_an_example_call_passed(tmp_path):
    # T5 given no cache builds one from a copy of its config, which Dynamo
    # cannot trace: a recapture that replayed model.generate()'s first call
    # with None for the cache would flag the entry and fail.
    def decline(ep):
        raise torch._dynamo.exc.SkipFrame("no compile in this test")

    cap = precompile_capture.capture(WithCache(), name="m", decline=decline)
    ids = torch.zeros(1, 3, dtype=torch.int64)
    cap(ids, cache=_encoder_decoder_cache())
    cap(ids, cache=_encoder_decoder_cache(past=1, encoder=3))
    m = build_manifest(cap._contents({}), str(tmp_path), {})
    cap.close()
    frame = m.frames[0]
    assert [s.parameter for s in frame.structures] == ["cache"]
    assert frame.structures[0].tree_spec and frame.structures[0].empty_tree_spec
    _, kwargs = call_from_signature(m.captured_calls[0], frame, seed=0, int_ranges={})
    assert type(kwargs["cache"]).__name__ == "EncoderDecoderCache" and pytree.tree_leaves(kwargs["cache"]) == []
    _, kwargs = call_from_signature(m.captured_calls[1], frame, seed=0, int_ranges={})
    assert [t.shape for t in pytree.tree_leaves(kwargs["cache"])[:1]] == [(1, 4, 1, 16)]


def test_an_eager_program_takes_and_gives_structures():
    spec = pytree.tree_structure({"k": torch.ones(1), "v": torch.ones(1)})
    params = [precompile_eager.Param("x", precompile_eager.POSITIONAL_OR_KEYWORD),
              precompile_eager.Param("cache.k", precompile_eager.POSITIONAL_OR_KEYWORD, True, None, "cache", spec),
              precompile_eager.Param("cache.v", precompile_eager.POSITIONAL_OR_KEYWORD, True, None, "cache", spec)]

    def target(x, cache=None):
        return x if cache is None else x + cache["k"] * cache["v"]

    program = precompile_eager.Program("forward", target, params)
    assert program([torch.ones(1), torch.full((1,), 2.0), torch.full((1,), 3.0)])[0].item() == 7.0
    assert program([torch.ones(1), None, None])[0].item() == 1.0
    # A caller of the frame passes the structure: it is bound as its leaves.
    values = precompile_eager.bind("forward", params, (torch.ones(1),), {"cache": {"k": torch.ones(1), "v": torch.ones(1)}})
    assert len(values) == 3
    with pytest.raises(TypeError, match="argument 'cache': a dict of 1 leaves unlike"):
        precompile_eager.bind("forward", params, (torch.ones(1),), {"cache": {"k": torch.ones(1)}})


class CachedSteps(torch.nn.Module):
    """A decoder-shaped frame Dynamo gives up on once `steps` >= 1 (a graph
    break in a loop): it takes a cache of two tensors and returns the next."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)

    def forward(self, x, cache=None, steps: int = 0):
        h = self.proj(x)
        if cache is not None:
            h = h + cache[0].sum() * cache[1]
        for _ in range(steps):
            h = opaque(h)
        return h, [h * 2, h + 1]


def test_a_flagged_frame_runs_its_python_program_with_the_structure_rebuilt(tmp_path):
    torch.manual_seed(0)
    model = CachedSteps().eval()
    cap = precompile_capture.capture(model, name="cached")
    x = torch.randn(2, 4)
    first = cap(x)  # A variant, while the cache is None.
    cap(x, cache=first[1], steps=1)  # A graph break in a loop: flagged.
    info = cap.frame("forward")
    assert info.eager_fallback
    assert [name for name, _ in info.parameters] == ["x", "cache.0", "cache.1", "steps"]
    m = read_manifest(cap.save(tmp_path / "out"))
    forward = m.frames[0]
    assert [p.structure for p in forward.parameters] == ["", "cache", "cache", ""]
    assert [s.parameter for s in forward.structures] == ["cache"]
    # The variant captured before the cache was seen takes None for each leaf.
    assert [g.tensor.is_none for g in forward.variants[0].guards if g.parameter in (1, 2)] == [True, True]
    program = precompile_eager.load(str(tmp_path / "out" / forward.python_program.path), "cpu")
    with torch.no_grad():
        want = model(x, cache=first[1], steps=1)
        got = program([x, first[1][0], first[1][1], 1])
        assert all(torch.equal(a, b) for a, b in zip(got, pytree.tree_leaves(want)))
        got = program([x, None, None, 2])
        assert all(torch.equal(a, b) for a, b in zip(got, pytree.tree_leaves(model(x, steps=2))))
