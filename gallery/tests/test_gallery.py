"""The gallery served end to end: models nobody here wrote, captured at build
time by the capture tool, served by the real server on loopback, called the
way their users call them (through the KServe v2 stubs generated from the
project's protos), and compared with the same models run eagerly.

Every call here but one uses a shape the capture never saw (within a
variant's guards), so a variant compiled for the example calls has to
generalise.
"""

import zipfile

import grpc
import numpy as np
import pytest
import torch
from conftest import ROOT, eager, tokens

from gallery import models
from proto import inference_pb2, inference_pb2_grpc

DATATYPES = {np.dtype("int64"): "INT64", np.dtype("float32"): "FP32"}


@pytest.fixture(scope="module")
def stub(server):
    with grpc.insecure_channel(server.address) as channel:
        yield inference_pb2_grpc.GRPCInferenceServiceStub(channel)


def infer(stub, model, inputs, outputs=(), scalars=None):
    """ModelInfer with `inputs` (name -> numpy array) as raw contents and
    `scalars` (name -> int) as parameters; returns (outputs by name, the
    response's parameters)."""
    request = inference_pb2.ModelInferRequest(model_name=model)
    for name, value in (scalars or {}).items():
        request.parameters[name].int64_param = value
    for name, array in inputs.items():
        array = np.ascontiguousarray(array)
        request.inputs.add(name=name, datatype=DATATYPES[array.dtype], shape=list(array.shape))
        request.raw_input_contents.append(array.tobytes())
    for name in outputs:
        request.outputs.add(name=name)
    response = stub.ModelInfer(request, timeout=60)
    got = {}
    for output, raw in zip(response.outputs, response.raw_output_contents):
        assert output.datatype == "FP32", output
        got[output.name] = np.frombuffer(raw, dtype="<f4").reshape(tuple(output.shape))
    parameters = {k: v.string_param for k, v in response.parameters.items()}
    return got, parameters


def test_bert_called_with_keywords_returns_its_model_output(stub):
    ids, mask = tokens(3, 11, seed=0)
    got, parameters = infer(stub, "bert", {"input_ids": ids, "attention_mask": mask})
    assert parameters == {"precompile_outcome": "variant", "precompile_variant": "forward#1"}
    want = eager(models.make_bert, input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask))
    assert list(got) == ["last_hidden_state", "pooler_output"]
    np.testing.assert_allclose(got["last_hidden_state"], want.last_hidden_state.numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got["pooler_output"], want.pooler_output.numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("model, factory, output", [
    ("bert", models.make_bert, "last_hidden_state"),
    ("roberta", models.make_roberta, "logits"),
    ("opt", models.make_opt, "logits"),
])
def test_one_sentence_of_a_new_length_is_served(stub, model, factory, output):
    # What most of their users send. Export, as Dynamo, specialises size 1, so
    # the dynamic variant's batch starts at 2; the calls file's one-sentence
    # call made a variant of its own, with the length dynamic.
    ids, mask = tokens(1, 19, seed=3)
    got, parameters = infer(stub, model, {"input_ids": ids, "attention_mask": mask})
    assert parameters == {"precompile_outcome": "variant", "precompile_variant": "forward#2"}
    want = eager(factory, input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask))
    np.testing.assert_allclose(got[output], getattr(want, output).numpy(), rtol=1e-4, atol=1e-4)


def test_bert_sends_only_the_outputs_asked_for(stub):
    ids, mask = tokens(2, 8, seed=1)  # The static variant's shape.
    got, parameters = infer(stub, "bert", {"input_ids": ids, "attention_mask": mask}, ["pooler_output"])
    assert parameters["precompile_outcome"] == "variant"
    want = eager(models.make_bert, input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask))
    assert list(got) == ["pooler_output"]
    np.testing.assert_allclose(got["pooler_output"], want.pooler_output.numpy(), rtol=1e-4, atol=1e-4)


def test_gpt2_logits_on_a_new_batch_and_sequence_length(stub):
    ids, mask = tokens(3, 29, seed=2)
    got, parameters = infer(stub, "gpt2", {"input_ids": ids, "attention_mask": mask})
    assert parameters["precompile_variant"] == "forward#1"
    want = eager(models.make_gpt2, input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask))
    assert list(got) == ["logits"] and got["logits"].shape == (3, 29, 1000)
    np.testing.assert_allclose(got["logits"], want.logits.numpy(), rtol=1e-4, atol=1e-4)


def test_roberta_classifies_a_new_batch_and_length(stub):
    ids, mask = tokens(3, 11, seed=30)
    got, parameters = infer(stub, "roberta", {"input_ids": ids, "attention_mask": mask})
    assert parameters == {"precompile_outcome": "variant", "precompile_variant": "forward#1"}
    want = eager(models.make_roberta, input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask))
    assert list(got) == ["logits"] and got["logits"].shape == (3, 3)
    np.testing.assert_allclose(got["logits"], want.logits.numpy(), rtol=1e-4, atol=1e-4)


def test_roberta_refuses_a_sequence_past_its_counted_positions(stub):
    # RoBERTa's positions count the tokens that are not padding, from
    # pad_token_id + 1 = 2: 128 tokens reach row 129, the last of its table.
    # torch.export bounds nothing; served 129 tokens, the compiled code
    # read past the table and ended the server.
    ids, mask = tokens(3, 129, seed=31)
    ids[ids == 1] = 2  # No padding token: every position counts.
    with pytest.raises(grpc.RpcError) as error:
        infer(stub, "roberta", {"input_ids": ids, "attention_mask": mask})
    assert error.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "input_ids.size(1): expected a size in [2, 128], got 129" in error.value.details()
    ids, mask = ids[:, :128].copy(), mask[:, :128].copy()
    got, _ = infer(stub, "roberta", {"input_ids": ids, "attention_mask": mask})
    want = eager(models.make_roberta, input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask))
    np.testing.assert_allclose(got["logits"], want.logits.numpy(), rtol=1e-4, atol=1e-4)


def test_opt_logits_on_a_new_batch_and_length_with_padding(stub):
    ids, mask = tokens(3, 11, seed=32)
    got, parameters = infer(stub, "opt", {"input_ids": ids, "attention_mask": mask})
    assert parameters == {"precompile_outcome": "variant", "precompile_variant": "forward#1"}
    want = eager(models.make_opt, input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask))
    assert list(got) == ["logits"] and got["logits"].shape == (3, 11, 1000)
    np.testing.assert_allclose(got["logits"], want.logits.numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("length, mask_value, code, message", [
    # OPT's positions count the mask's ones: 129 tokens, or a mask of 5s,
    # would read past its table of 130 positions (once it ended the server).
    (129, 1, grpc.StatusCode.FAILED_PRECONDITION, "input_ids.size(1): expected a size in [2, 128], got 129"),
    (8, 5, grpc.StatusCode.INVALID_ARGUMENT,
     "argument 'attention_mask' holds 5 at flat index 0; each value must be in [0, 2), the range in "
     "which the capture proved the model's table lookups stay in bounds"),
])
def test_opt_refuses_what_would_count_past_its_positions(stub, length, mask_value, code, message):
    ids, mask = tokens(3, length, seed=33)
    with pytest.raises(grpc.RpcError) as error:
        infer(stub, "opt", {"input_ids": ids, "attention_mask": np.full_like(mask, mask_value)})
    assert error.value.code() == code
    assert message in error.value.details()
    got, _ = infer(stub, "opt", {"input_ids": ids[:, :128], "attention_mask": mask[:, :128]})
    assert got["logits"].shape == (3, min(length, 128), 1000)


def test_resnet18_on_a_new_batch_size(stub):
    x = np.random.default_rng(3).standard_normal((3, 3, 224, 224), dtype=np.float32)
    got, parameters = infer(stub, "resnet18", {"x": x})
    assert parameters["precompile_variant"] == "forward#1"
    want = eager(models.make_resnet18, torch.from_numpy(x))
    assert list(got) == ["output0"] and got["output0"].shape == (3, 1000)
    np.testing.assert_allclose(got["output0"], want.numpy(), rtol=1e-3, atol=1e-3)


def test_metadata_names_the_inputs_the_calls_passed_and_the_outputs_by_path(stub):
    meta = stub.ModelMetadata(inference_pb2.ModelMetadataRequest(name="bert"), timeout=10)
    assert [(t.name, t.datatype, list(t.shape)) for t in meta.inputs] == [
        ("input_ids", "INT64", [-1, -1]),
        ("attention_mask", "INT64", [-1, -1]),
    ]
    assert [(t.name, list(t.shape)) for t in meta.outputs] == [
        ("last_hidden_state", [-1, -1, 64]),
        ("pooler_output", [-1, 64]),
    ]
    config = stub.ModelConfig(inference_pb2.ModelConfigRequest(name="gpt2"), timeout=10).config
    assert [(t.name, t.optional) for t in config.input] == [("input_ids", True), ("attention_mask", True)]
    assert [t.name for t in config.output] == ["logits"]


@pytest.mark.parametrize("inputs, outputs, code, message", [
    ({"input_idz": np.zeros((2, 8), np.int64)}, (), grpc.StatusCode.INVALID_ARGUMENT,
     "model 'bert' has no input 'input_idz' (its inputs: input_ids, attention_mask)"),
    ({"input_ids": np.zeros((2, 8), np.int64), "attention_mask": np.ones((2, 8), np.int64)}, ["logits"],
     grpc.StatusCode.INVALID_ARGUMENT,
     "model 'bert' has no output 'logits' (its outputs: last_hidden_state, pooler_output)"),
    # An argument no example call passed is guarded to stay None.
    ({"input_ids": np.zeros((2, 8), np.int64), "attention_mask": np.ones((2, 8), np.int64),
      "token_type_ids": np.zeros((2, 8), np.int64)}, (), grpc.StatusCode.FAILED_PRECONDITION,
     "token_type_ids: expected None, got a tensor"),
    # The capture always passed a mask.
    ({"input_ids": np.zeros((2, 8), np.int64)}, (), grpc.StatusCode.FAILED_PRECONDITION,
     "attention_mask: expected a tensor, got None"),
    ({"input_ids": np.zeros((2, 8), np.float32), "attention_mask": np.ones((2, 8), np.int64)}, (),
     grpc.StatusCode.FAILED_PRECONDITION, "input_ids.dtype: expected int64, got float32"),
    # The mask's batch is indexed by input_ids' batch: the compiled code
    # would read past the mask and end the process, so the guards require
    # the two equal.
    ({"input_ids": np.zeros((16, 8), np.int64), "attention_mask": np.ones((2, 8), np.int64)}, (),
     grpc.StatusCode.FAILED_PRECONDITION, "attention_mask.size(0): expected input_ids.size(0)"),
    # A token id past the vocabulary: compiled code would read past the
    # embedding table (and end the process), so the value is checked first.
    ({"input_ids": np.full((2, 8), 1000, np.int64), "attention_mask": np.ones((2, 8), np.int64)}, (),
     grpc.StatusCode.INVALID_ARGUMENT,
     "argument 'input_ids' holds 1000 at flat index 0; each value must be in [0, 1000), the range in "
     "which the capture proved the model's table lookups stay in bounds"),
])
def test_bad_calls_are_refused_by_name_and_the_server_keeps_serving(stub, inputs, outputs, code, message):
    with pytest.raises(grpc.RpcError) as error:
        infer(stub, "bert", inputs, outputs)
    assert error.value.code() == code
    assert message in error.value.details()
    ids, mask = tokens(2, 8, seed=5)
    got, _ = infer(stub, "bert", {"input_ids": ids, "attention_mask": mask})
    assert got["pooler_output"].shape == (2, 64)


def test_gpt2_refuses_a_sequence_longer_than_its_positions(stub):
    # torch.export leaves the sequence length unbounded, but the positions
    # index a table of n_positions=128 rows: the capture bounds it.
    ids, mask = tokens(2, 129, seed=6)
    with pytest.raises(grpc.RpcError) as error:
        infer(stub, "gpt2", {"input_ids": ids, "attention_mask": mask})
    assert error.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "input_ids.size(1): expected" in error.value.details()
    assert "got 129" in error.value.details()
    ids, mask = tokens(2, 128, seed=7)
    got, _ = infer(stub, "gpt2", {"input_ids": ids, "attention_mask": mask})
    assert got["logits"].shape == (2, 128, 1000)


def test_bert_behind_a_flagged_wrapper_runs_its_python_and_its_layers_compiled(stub, server):
    # The wrapper's misses run its own Python (BertModel's embeddings and
    # masks included); the layers run their variants, padded or not.
    for i, (batch, sequence, steps) in enumerate([(3, 11, 2), (5, 7, 1), (2, 8, 3)]):
        ids, mask = tokens(batch, sequence, seed=10 + i)
        got, parameters = infer(stub, "bert_recentering", {"input_ids": ids, "attention_mask": mask},
                                scalars={"recenter_steps": steps})
        assert parameters["precompile_outcome"] == "eager_fallback"
        want = eager(models.make_bert_recentering, input_ids=torch.from_numpy(ids),
                     attention_mask=torch.from_numpy(mask), recenter_steps=steps)
        np.testing.assert_allclose(got["output0"], want.numpy(), rtol=1e-4, atol=1e-4)
    assert server.log().count("event=eager_fallback model=bert_recentering frame=forward") == 1
    ids, mask = np.ones((2, 8), np.int64), np.ones((2, 8), np.int64)
    _, parameters = infer(stub, "bert_recentering", {"input_ids": ids, "attention_mask": mask},
                          scalars={"recenter_steps": 0})
    assert parameters == {"precompile_outcome": "variant", "precompile_variant": "forward#0"}


def test_bert_behind_a_flagged_wrapper_refuses_what_its_layers_do_not_cover(stub):
    # Dynamo specialises size 1: no layer variant takes a batch of one, and
    # the layer's refusal is the request's.
    ids, mask = tokens(1, 8, seed=20)
    with pytest.raises(grpc.RpcError) as error:
        infer(stub, "bert_recentering", {"input_ids": ids, "attention_mask": mask},
              scalars={"recenter_steps": 1})
    assert error.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "no captured variant matches this call of frame 'bert.encoder.layer.0'" in error.value.details()


def test_a_python_loop_past_the_request_limit_ends_and_the_server_goes_on(stub):
    # recenter_steps drives a Python loop in the wrapper's eager program with
    # no frame inside: 10^12 steps would take days. The server's limit
    # (--max_request_seconds in conftest) interrupts the interpreter.
    ids, mask = tokens(2, 8, seed=21)
    with pytest.raises(grpc.RpcError) as error:
        infer(stub, "bert_recentering", {"input_ids": ids, "attention_mask": mask},
              scalars={"recenter_steps": 10**12})
    assert error.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert "while frame 'forward' ran its Python eager program" in error.value.details()
    got, _ = infer(stub, "bert_recentering", {"input_ids": ids, "attention_mask": mask},
                   scalars={"recenter_steps": 1})
    want = eager(models.make_bert_recentering, input_ids=torch.from_numpy(ids),
                 attention_mask=torch.from_numpy(mask), recenter_steps=1)
    np.testing.assert_allclose(got["output0"], want.numpy(), rtol=1e-4, atol=1e-4)


def test_compiled_kernels_take_the_serving_threads_not_the_capture_machines():
    # `num_threads(N)` in a kernel would run N OpenMP threads (N this
    # machine's cores at capture time) whatever cores the server is given.
    packages = sorted((ROOT / "gallery" / "bert" / "frames").resolve().glob("*/*.pt2"))
    assert packages
    parallel = 0
    for package in packages:
        with zipfile.ZipFile(package) as archive:
            for name in archive.namelist():
                if name.endswith(".cpp"):
                    code = archive.read(name).decode()
                    parallel += code.count("#pragma omp parallel")
                    assert "omp parallel num_threads(" not in code, f"{package.name}: {name}"
    assert parallel > 0, "BERT's kernels have parallel loops"
