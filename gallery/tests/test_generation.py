"""A decoder generates through the server with its cache sent back and
forth (client/python/generate.py), token for token what transformers'
model.generate() gives in process; a cache that does not fit the call is
refused, naming the input, and the server goes on serving.

tritonclient's protos and the project's share a package name: this file
runs in a process of its own.
"""

import sys

import numpy as np
import pytest
import torch
import tritonclient.grpc as triton
from conftest import ROOT
from tritonclient.utils import InferenceServerException

from gallery import models

sys.path.insert(0, str(ROOT / "client" / "python"))
import generate  # noqa: E402

MODEL = "gpt2_decoder"
PROMPT = [17, 4, 99, 250, 3, 861]  # A length the capture never saw.
LAYERS, HEADS, HEAD_DIM = 2, 4, 16


@pytest.fixture(scope="module")
def client(server):
    return triton.InferenceServerClient(server.address)


FACTORIES = {"gpt2_decoder": models.make_gpt2_decoder, "llama_decoder": models.make_llama_decoder}


def _in_process(prompt, tokens, model=MODEL):
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = FACTORIES[model]().generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=tokens, do_sample=False,
            pad_token_id=0)
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("model", sorted(FACTORIES))
def test_generated_tokens_equal_model_generate(client, model):
    # 20 tokens: the cache grows from 6 to 25 positions through one variant.
    assert generate.generate(client, model, PROMPT, 20) == _in_process(PROMPT, 20, model)


@pytest.mark.parametrize("model", sorted(FACTORIES))
def test_a_one_token_prompt_generates_as_model_generate_does(client, model):
    # Its own static prefill variant, then a cache of one position.
    assert generate.generate(client, model, [7], 6) == _in_process([7], 6, model)


@pytest.mark.parametrize("model", sorted(FACTORIES))
def test_each_step_scores_the_sequence_as_the_whole_sequence_does(client, model):
    # Greedy tokens of random weights can repeat whatever the cache holds:
    # the logits of every step, fed a fixed sequence, must equal those of
    # the model run on the whole sequence at once.
    sequence = [int(t) for t in np.random.default_rng(1).integers(0, 1000, 16)]
    names = generate.cache_outputs(client, model)
    requested = [triton.InferRequestedOutput(n) for n in ["logits"] + names]
    cache, steps = {}, []
    for end in range(6, len(sequence) + 1):
        ids = np.array([sequence[:end] if not cache else sequence[end - 1:end]], dtype=np.int64)
        inputs = [generate._input("input_ids", ids), generate._input("attention_mask", np.ones((1, end), dtype=np.int64))]
        inputs += [generate._input(n, v) for n, v in cache.items()]
        result = client.infer(model, inputs, outputs=requested)
        steps.append(result.as_numpy("logits")[0, -1])
        cache = {n: result.as_numpy(n) for n in names}
    with torch.no_grad():
        whole = FACTORIES[model]()(input_ids=torch.tensor([sequence])).logits[0, 5:].numpy()
    np.testing.assert_allclose(np.stack(steps), whole, rtol=1e-4, atol=1e-4)


def test_cache_is_served_by_name_in_metadata(client):
    meta = client.get_model_metadata(MODEL)
    cache = [f"past_key_values.{kind}.{layer}" for kind in ("key_cache", "value_cache")
             for layer in range(LAYERS)]
    assert generate.cache_outputs(client, MODEL) == cache
    inputs = {i.name: list(i.shape) for i in meta.inputs}
    for name in cache:
        assert inputs[name] == [1, HEADS, -1, HEAD_DIM]


def _decode(client, past, mask_length, lengths=None, leave_out=()):
    """One decode call with a random cache of `past` positions (per leaf
    `lengths` instead), `mask_length` mask positions."""
    rng = np.random.default_rng(0)
    inputs = [generate._input("input_ids", np.array([[5]], dtype=np.int64)),
              generate._input("attention_mask", np.ones((1, mask_length), dtype=np.int64))]
    for name in generate.cache_outputs(client, MODEL):
        if name in leave_out:
            continue
        length = (lengths or {}).get(name, past)
        inputs.append(generate._input(name, rng.standard_normal((1, HEADS, length, HEAD_DIM)).astype(np.float32)))
    return client.infer(MODEL, inputs)


def _refusal(call):
    with pytest.raises(InferenceServerException) as e:
        call()
    assert e.value.status() == "StatusCode.FAILED_PRECONDITION", e.value
    return e.value.message()


def test_a_cache_that_does_not_fit_the_call_is_refused_naming_the_input(client):
    assert _decode(client, 9, 10).as_numpy("logits").shape == (1, 1, 1000)
    # The mask must be one longer than the cache.
    message = _refusal(lambda: _decode(client, 9, 12))
    assert "attention_mask.size(1): expected past_key_values.key_cache.0.size(2)+1 (10), got 12" in message
    # Every layer's keys and values hold the same positions.
    message = _refusal(lambda: _decode(client, 9, 10, lengths={"past_key_values.value_cache.1": 8}))
    assert "past_key_values.value_cache.1.size(2): expected past_key_values.key_cache.0.size(2) (9), got 8" in message
    # A layer left out.
    message = _refusal(lambda: _decode(client, 9, 10, leave_out=("past_key_values.key_cache.1",)))
    assert "past_key_values.key_cache.1" in message
    # Positions past the model's 128 (its position table) are refused, not read.
    assert _decode(client, 127, 128).as_numpy("logits").shape == (1, 1, 1000)
    message = _refusal(lambda: _decode(client, 128, 129))
    assert "past_key_values.key_cache.0.size(2): expected" in message and "got 128" in message
    # And the server goes on serving.
    assert generate.generate(client, MODEL, PROMPT[:5], 2) == _in_process(PROMPT[:5], 2)
