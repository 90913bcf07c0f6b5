"""A decoder generates through the server with its cache sent back and
forth (client/python/generate.py), token for token what transformers'
model.generate() gives in process; a cache that does not fit the call is
refused, naming the input, and the server goes on serving.

tritonclient's protos and the project's share a package name: this file
runs in a process of its own.
"""

import json
import re
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch
import tritonclient.grpc as triton
import tritonclient.http as triton_http
from conftest import ROOT, STATEFUL_CONFIG, ServerProcess, add_model
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


def _in_process(prompt, tokens, model=MODEL, **options):
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = FACTORIES[model]().generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=tokens, do_sample=False,
            pad_token_id=0, **options)
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("model", sorted(FACTORIES))
def test_generated_tokens_equal_model_generate(client, model):
    # 20 tokens: the cache grows from 6 to 25 positions through one variant.
    assert generate.generate(client, model, PROMPT, 20) == _in_process(PROMPT, 20, model)




# Prompts of different lengths in one batch: left-padded to the longest.
BATCH = [PROMPT, [5, 6], [7, 8, 9, 10]]


def _in_process_batch(prompts, tokens, model):
    ids, mask = generate.left_padded(prompts, 0)
    with torch.no_grad():
        out = FACTORIES[model]().generate(
            torch.from_numpy(ids), attention_mask=torch.from_numpy(mask), max_new_tokens=tokens,
            do_sample=False, pad_token_id=0)
    return out[:, ids.shape[1]:].tolist()


def test_a_decoder_without_its_cache_generates_from_the_whole_sequence_each_step(client):
    # The gallery's gpt2 is gpt2_decoder's model captured with use_cache=False
    # (its batch from 2, as Dynamo makes it), and takes no position_ids:
    # prompts of one length, which need none.
    prompts = [PROMPT, [9, 31, 2, 600, 41, 7]]
    assert generate.generate_batch(client, "gpt2", prompts, 8) == _in_process_batch(
        prompts, 8, "gpt2_decoder")


@pytest.mark.parametrize("model", sorted(FACTORIES))
def test_a_batch_of_prompts_generates_as_model_generate_does(client, model):
    # One call per token for the whole batch; each row's positions count
    # from its own first token, as generate() passes them.
    assert generate.generate_batch(client, model, BATCH, 12) == _in_process_batch(BATCH, 12, model)
    assert generate.generate_batch(client, model, BATCH[1:], 4) == \
        _in_process_batch(BATCH[1:], 4, model)


@pytest.mark.parametrize("model", sorted(FACTORIES))
def test_a_one_token_prompt_generates_as_model_generate_does(client, model):
    # Its own static prefill variant, then a cache of one position.
    assert generate.generate(client, model, [7], 6) == _in_process([7], 6, model)


def _steps_sending_the_cache(client, model, sequence):
    """The last position's logits of each step through `sequence` (its first
    6 tokens the prompt, then one a step, the cache sent back and forth),
    and each response's precompile_outcome."""
    names = generate.cache_outputs(client, model)
    requested = [triton.InferRequestedOutput(n) for n in ["logits"] + names]
    cache, steps, outcomes = {}, [], []
    for end in range(6, len(sequence) + 1):
        ids = np.array([sequence[:end] if not cache else sequence[end - 1:end]], dtype=np.int64)
        inputs = generate.token_inputs(ids, np.ones((1, end), dtype=np.int64))
        inputs += [generate._input(n, v) for n, v in cache.items()]
        result = client.infer(model, inputs, outputs=requested)
        steps.append(result.as_numpy("logits")[0, -1])
        outcomes.append(result.get_response().parameters["precompile_outcome"].string_param)
        cache = {n: result.as_numpy(n) for n in names}
    return np.stack(steps), outcomes


@pytest.mark.parametrize("model", sorted(FACTORIES))
def test_each_step_scores_the_sequence_as_the_whole_sequence_does(client, model):
    # Greedy tokens of random weights can repeat whatever the cache holds:
    # the logits of every step, fed a fixed sequence, must equal those of
    # the model run on the whole sequence at once.
    sequence = [int(t) for t in np.random.default_rng(1).integers(0, 1000, 16)]
    steps, _ = _steps_sending_the_cache(client, model, sequence)
    with torch.no_grad():
        whole = FACTORIES[model]()(input_ids=torch.tensor([sequence])).logits[0, 5:].numpy()
    np.testing.assert_allclose(steps, whole, rtol=1e-4, atol=1e-4)


def test_cache_is_served_by_name_in_metadata(client):
    meta = client.get_model_metadata(MODEL)
    cache = [f"past_key_values.{kind}.{layer}" for kind in ("key_cache", "value_cache")
             for layer in range(LAYERS)]
    assert generate.cache_outputs(client, MODEL) == cache
    inputs = {i.name: list(i.shape) for i in meta.inputs}
    for name in cache:
        assert inputs[name] == [-1, HEADS, -1, HEAD_DIM]  # A batch of one or more.


def _decode(client, past, mask_length, lengths=None, leave_out=(), model=MODEL):
    """One decode call of `model` with a random cache of `past` positions
    (per leaf `lengths` instead), `mask_length` mask positions."""
    rng = np.random.default_rng(0)
    inputs = generate.token_inputs(np.array([[5]], dtype=np.int64),
                                   np.ones((1, mask_length), dtype=np.int64))
    for name in generate.cache_outputs(client, model):
        if name in leave_out:
            continue
        length = (lengths or {}).get(name, past)
        inputs.append(generate._input(name, rng.standard_normal((1, HEADS, length, HEAD_DIM)).astype(np.float32)))
    return client.infer(model, inputs)


def _refusal(call):
    with pytest.raises(InferenceServerException) as e:
        call()
    assert e.value.status() == "StatusCode.FAILED_PRECONDITION", e.value.message()
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
    with pytest.raises(InferenceServerException) as e:
        _decode(client, 128, 129)
    assert e.value.status() == "StatusCode.INVALID_ARGUMENT", e.value.message()
    assert ("argument 'position_ids' holds 128 at flat index 0; each value must be in [0, 128), the "
            "range in which the capture proved the model's table lookups stay in bounds"
            ) in e.value.message()
    # And the server goes on serving.
    assert generate.generate(client, MODEL, PROMPT[:5], 2) == _in_process(PROMPT[:5], 2)


# An encoder-decoder: T5, its cache an EncoderDecoderCache (the decoder's
# own positions, and the encoder's keys and values for cross-attention).

T5 = "t5_decoder"


def _t5_in_process(prompt, tokens, **options):
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = models.make_t5_decoder().generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=tokens, do_sample=False, **options)
    return out[0, 1:].tolist()  # After the decoder's start token.


def test_an_encoder_decoder_generates_as_model_generate_does(client):
    # Prompts of lengths the capture never saw; 20 tokens: the decoder's
    # cache grows from 1 to 20 positions through one variant, the encoder
    # runs once per prompt.
    for prompt in (PROMPT + [42], [7, 8, 9]):
        expected = _t5_in_process(prompt, 20)
        assert len(expected) == 20  # No end-of-sequence token cut it short.
        assert generate.generate_seq2seq(client, T5, prompt, 20) == expected


def test_a_forced_end_token_is_the_last_as_model_generate_makes_it(client):
    # BART's and Marian's configs force their end-of-sequence token as the
    # last of the tokens asked for; 333 is no token greedy decoding picks here.
    prompt = [7, 8, 9]
    expected = _t5_in_process(prompt, 6, forced_eos_token_id=333)
    assert expected[-1] == 333 and expected[:-1] == _t5_in_process(prompt, 5)
    assert generate.generate_seq2seq(client, T5, prompt, 6, forced_eos=333) == expected
    expected = _in_process(PROMPT, 6, forced_eos_token_id=333)
    assert expected[-1] == 333
    assert generate.generate(client, MODEL, PROMPT, 6, forced_eos=333) == expected
    assert generate.generate_stateful(client, "gpt2_decoder_stateful", PROMPT, 6, 91,
                                      forced_eos=333) == expected


def test_an_encoder_decoder_serves_both_caches_by_name(client):
    meta = client.get_model_metadata(T5)
    inputs = {i.name: list(i.shape) for i in meta.inputs}
    cache = [f"past_key_values.{attention}.{kind}.{layer}"
             for attention in ("self_attention_cache", "cross_attention_cache")
             for kind in ("key_cache", "value_cache") for layer in range(LAYERS)]
    assert generate.cache_outputs(client, T5) == cache
    for name in cache:
        assert inputs[name] == [1, HEADS, -1, HEAD_DIM]
    assert inputs["encoder_outputs.0"] == [1, -1, 64]
    assert generate.ENCODER_OUTPUT in [o.name for o in meta.outputs]


def _t5_decode(client, prompt_length, past, cross=None, mask=None):
    """One decode step with random caches: `past` decoder positions, the
    encoder's `prompt_length` (the cross-attention cache's `cross`)."""
    rng = np.random.default_rng(0)
    inputs = [generate._input("decoder_input_ids", np.array([[5]], dtype=np.int64)),
              generate._input("attention_mask", np.ones((1, mask or prompt_length), dtype=np.int64)),
              generate._input("encoder_outputs.0",
                              rng.standard_normal((1, prompt_length, 64)).astype(np.float32))]
    for name in generate.cache_outputs(client, T5):
        length = (cross or prompt_length) if "cross_attention" in name else past
        inputs.append(generate._input(name, rng.standard_normal((1, HEADS, length, HEAD_DIM)).astype(np.float32)))
    return client.infer(T5, inputs)


def test_an_encoder_decoder_cache_that_does_not_fit_is_refused_naming_the_input(client):
    assert _t5_decode(client, 8, 3).as_numpy("logits").shape == (1, 1, 1000)
    # The cross-attention cache holds the encoder's positions, as many as
    # the mask and the encoder's output.
    message = _refusal(lambda: _t5_decode(client, 8, 3, cross=7))
    assert "past_key_values.cross_attention_cache.key_cache.0.size(2): expected " \
           "attention_mask.size(1) (8), got 7" in message
    message = _refusal(lambda: _t5_decode(client, 8, 3, mask=9))
    assert "encoder_outputs.0.size(1): expected attention_mask.size(1) (9), got 8" in message
    assert generate.generate_seq2seq(client, T5, [7, 8, 9], 3) == _t5_in_process([7, 8, 9], 3)


def test_an_encoder_decoder_keeps_its_encoder_output_and_caches_on_the_server(client):
    # gallery/t5_decoder_stateful.config.pbtxt: the encoder's output comes
    # back as encoder_outputs.0, the caches as themselves; a request after
    # the first carries the new token and the mask.
    model = "t5_decoder_stateful"
    meta = client.get_model_metadata(model)
    assert [i.name for i in meta.inputs] == ["input_ids", "attention_mask", "decoder_input_ids"]
    assert [o.name for o in meta.outputs] == ["logits"]
    for sequence_id, prompt in ((81, PROMPT + [42]), (82, [7, 8, 9])):
        assert generate.generate_seq2seq_stateful(client, model, prompt, 12, sequence_id) == \
            _t5_in_process(prompt, 12)


# Stateful: the same decoders served with sequence_batching, the cache kept
# by the server (gallery/decoder_stateful.config.pbtxt).

STATEFUL = {"gpt2_decoder": "gpt2_decoder_stateful", "llama_decoder": "llama_decoder_stateful"}
STATE = [f"past_key_values.{kind}.{layer}" for kind in ("key_cache", "value_cache")
         for layer in range(LAYERS)]


def _step(client, model, ids, past, sequence_id, start=False, end=False, **kwargs):
    """One request of sequence `sequence_id`: token ids after `past`
    positions the server holds; the last position's logits."""
    ids = np.asarray([ids], dtype=np.int64)
    inputs = generate.token_inputs(ids, np.ones((1, past + ids.shape[1]), dtype=np.int64))
    result = client.infer(model, inputs, sequence_id=sequence_id, sequence_start=start,
                          sequence_end=end, **kwargs)
    # The cache stays on the server.
    assert [o.name for o in result.get_response().outputs] == ["logits"]
    return result.as_numpy("logits")[0, -1]


def _refused(call, code):
    with pytest.raises(InferenceServerException) as e:
        call()
    assert e.value.status() == f"StatusCode.{code}", e.value
    return e.value.message()


@pytest.mark.parametrize("model", sorted(STATEFUL))
def test_stateful_generation_equals_model_generate(client, model):
    # The cache never crosses the wire; the tokens are those of generate().
    assert generate.generate_stateful(client, STATEFUL[model], PROMPT, 20, sequence_id=11) == \
        _in_process(PROMPT, 20, model)
    assert generate.generate_stateful(client, STATEFUL[model], [7], 6, sequence_id=12) == \
        _in_process([7], 6, model)


@pytest.mark.parametrize("model", sorted(STATEFUL))
def test_generation_ends_at_the_end_of_sequence_token_as_model_generate_does(client, model):
    # The end-of-sequence token: one the second prompt makes at its fourth
    # step. generate() pads a row that has ended and stops once all have;
    # the client cuts each row after its token, and stops calling then too.
    eos = _in_process_batch(BATCH, 12, model)[1][3]
    ids, mask = generate.left_padded(BATCH, 0)
    with torch.no_grad():
        out = FACTORIES[model]().generate(
            torch.from_numpy(ids), attention_mask=torch.from_numpy(mask), max_new_tokens=12,
            do_sample=False, pad_token_id=0, eos_token_id=eos)
    expected = [row[:row.index(eos) + 1] if eos in row else row for row in out[:, ids.shape[1]:].tolist()]
    assert len(expected[1]) <= 4
    assert generate.generate_batch(client, model, BATCH, 12, eos=eos) == expected
    assert generate.generate_stateful_batch(client, STATEFUL[model], BATCH, 12, sequence_id=21,
                                            eos=eos) == expected


@pytest.mark.parametrize("model", sorted(STATEFUL))
def test_a_sequence_that_ends_at_its_end_of_sequence_token_is_ended_on_the_server(client, model):
    # Every row ends before the last step: the client ends the sequence with
    # one more call rather than leave its cache held until it is idle too long.
    tokens = _in_process(PROMPT, 12, model)
    eos = tokens[3]
    assert generate.generate_stateful(client, STATEFUL[model], PROMPT, 12, sequence_id=23, eos=eos) == \
        tokens[:tokens.index(eos) + 1]
    message = _refused(lambda: _step(client, STATEFUL[model], [6], len(PROMPT) + 5, 23), "FAILED_PRECONDITION")
    assert f"sequence 23 of model '{STATEFUL[model]}' is not active: it ended" in message


@pytest.mark.parametrize("model", sorted(STATEFUL))
def test_a_stateful_batch_generates_as_model_generate_does(client, model):
    # A sequence's state is the whole batch's cache.
    assert generate.generate_stateful_batch(client, STATEFUL[model], BATCH, 12, sequence_id=13) == \
        _in_process_batch(BATCH, 12, model)


@pytest.mark.parametrize("model", sorted(STATEFUL))
def test_each_stateful_step_scores_the_sequence_as_the_whole_sequence_does(client, model):
    # As the stateless test above: every step's logits, the cache held by
    # the server, equal those of the whole sequence run at once.
    sequence = [int(t) for t in np.random.default_rng(2).integers(0, 1000, 16)]
    steps = [_step(client, STATEFUL[model], sequence[:6], 0, 61, start=True)]
    for end in range(7, len(sequence) + 1):
        steps.append(_step(client, STATEFUL[model], sequence[end - 1:end], end - 1, 61,
                           end=end == len(sequence)))
    with torch.no_grad():
        whole = FACTORIES[model]()(input_ids=torch.tensor([sequence])).logits[0, 5:].numpy()
    np.testing.assert_allclose(np.stack(steps), whole, rtol=1e-4, atol=1e-4)


def test_sequences_over_http_as_over_grpc(server):
    # tritonclient's HTTP client sends the same parameters in the JSON body.
    client = triton_http.InferenceServerClient(server.http_address)

    def step(ids, past, **sequence):
        inputs = []
        mask = np.ones((1, past + len(ids)), dtype=np.int64)
        for name, value in (("input_ids", np.array([ids], dtype=np.int64)), ("attention_mask", mask),
                            ("position_ids", generate.position_ids(mask, len(ids)))):
            inputs.append(triton_http.InferInput(name, list(value.shape), "INT64"))
            inputs[-1].set_data_from_numpy(value)
        return client.infer(STATEFUL[MODEL], inputs, **sequence).as_numpy("logits")[0, -1]

    tokens = [int(np.argmax(step(PROMPT, 0, sequence_id=71, sequence_start=True)))]
    for past in range(len(PROMPT), len(PROMPT) + 3):
        tokens.append(int(np.argmax(step([tokens[-1]], past, sequence_id=71))))
    assert tokens == _in_process(PROMPT, 4)
    with pytest.raises(InferenceServerException) as e:
        step([5], 3, sequence_id=72)
    assert "sequence 72 of model 'gpt2_decoder_stateful' is not active" in e.value.message()
    # An id that is neither an integer nor a string, in Triton's JSON.
    body = json.dumps({"inputs": [{"name": "input_ids", "shape": [1, 1], "datatype": "INT64",
                                   "data": [5]}],
                       "parameters": {"sequence_id": 1.5, "sequence_start": True}}).encode()
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(f"http://{server.http_address}/v2/models/{STATEFUL[MODEL]}/infer",
                               body, timeout=10)
    assert e.value.code == 400
    assert "parameter 'sequence_id' is neither an integer nor a string" in e.value.read().decode()
    # Ids are held by the server: a string past 128 bytes is refused, 128 taken.
    with pytest.raises(InferenceServerException) as e:
        step([5], 0, sequence_id="x" * 129, sequence_start=True)
    assert "parameter 'sequence_id' is a string of 129 bytes" in e.value.message()
    step([5], 0, sequence_id="x" * 128, sequence_start=True, sequence_end=True)


def test_interleaved_sequences_each_keep_their_own_cache(server, client):
    # Three sequences stepped in turn, then four at once from threads (ids
    # that are strings, as Triton allows): each generates what it
    # generates alone.
    model = STATEFUL[MODEL]
    prompts = {101: [17, 4, 99], 102: [5, 6, 7, 8, 9, 10, 11], 103: [250]}
    got = {sid: [] for sid in prompts}
    for step in range(8):
        for sid, prompt in prompts.items():
            ids = prompt if step == 0 else [got[sid][-1]]
            past = 0 if step == 0 else len(prompt) + step - 1
            logits = _step(client, model, ids, past, sid, start=step == 0, end=step == 7)
            got[sid].append(int(np.argmax(logits)))
    assert got == {sid: _in_process(p, 8) for sid, p in prompts.items()}

    def alone(sid, prompt):
        return generate.generate_stateful(triton.InferenceServerClient(server.address), model,
                                          prompt, 10, sid)

    prompts = {f"thread-{i}": [3 + i, 40 * i + 1] for i in range(4)}
    with ThreadPoolExecutor(4) as pool:
        futures = {sid: pool.submit(alone, sid, p) for sid, p in prompts.items()}
    for sid, future in futures.items():
        assert future.result() == _in_process(prompts[sid], 10), sid


def test_a_sequence_ended_or_never_started_is_refused_saying_why(client):
    model = STATEFUL[MODEL]
    _step(client, model, PROMPT, 0, 21, start=True)
    _step(client, model, [5], len(PROMPT), 21, end=True)
    message = _refused(lambda: _step(client, model, [6], len(PROMPT) + 1, 21), "FAILED_PRECONDITION")
    assert "sequence 21 of model 'gpt2_decoder_stateful' is not active: it ended" in message
    message = _refused(lambda: _step(client, model, [6], 3, 22), "FAILED_PRECONDITION")
    assert "sequence 22 of model 'gpt2_decoder_stateful' is not active: a sequence's first " \
           "request carries sequence_start" in message
    message = _refused(lambda: client.infer(model, [generate._input("input_ids", np.array([[5]]))]),
                       "INVALID_ARGUMENT")
    assert "a request names its sequence with the parameter sequence_id" in message


def test_a_failed_step_leaves_the_sequence_as_it_was(client):
    # A mask of the wrong length is refused by the guards; the next, right
    # step continues from the cache as it was, to the tokens of generate().
    model = STATEFUL[MODEL]
    tokens = [int(np.argmax(_step(client, model, PROMPT, 0, 31, start=True)))]
    message = _refused(lambda: _step(client, model, [tokens[-1]], len(PROMPT) + 4, 31),
                       "FAILED_PRECONDITION")
    assert "attention_mask.size(1): expected past_key_values.key_cache.0.size(2)+1" in message
    # The client never sent that input: the answer says what it is.
    assert "('past_key_values.key_cache.0' is the state the server keeps for this sequence" in message
    for step in range(1, 6):
        tokens.append(int(np.argmax(_step(client, model, [tokens[-1]], len(PROMPT) + step - 1, 31))))
    assert tokens == _in_process(PROMPT, 6)


def test_the_cache_of_a_stateful_model_is_the_servers_alone(client):
    model = STATEFUL[MODEL]
    meta = client.get_model_metadata(model)
    assert [i.name for i in meta.inputs] == ["input_ids", "attention_mask", "position_ids"]
    assert [o.name for o in meta.outputs] == ["logits"]
    config = client.get_model_config(model).config
    assert [s.input_name for s in config.sequence_batching.state] == STATE
    assert [s.output_name for s in config.sequence_batching.state] == STATE
    assert list(config.sequence_batching.state[0].dims) == [-1, HEADS, -1, HEAD_DIM]
    assert config.sequence_batching.max_sequence_idle_microseconds == 60_000_000
    _step(client, model, PROMPT, 0, 41, start=True)
    cache = generate._input(STATE[0], np.zeros((1, HEADS, 6, HEAD_DIM), dtype=np.float32))
    message = _refused(lambda: client.infer(
        model, generate.token_inputs(np.array([[5]]), np.ones((1, 7), dtype=np.int64)) + [cache],
        sequence_id=41), "INVALID_ARGUMENT")
    assert f"input '{STATE[0]}' of model 'gpt2_decoder_stateful' is its sequences' state" in message
    message = _refused(lambda: _step(client, model, [5], 6, 41,
                                     outputs=[triton.InferRequestedOutput(STATE[1])]),
                       "INVALID_ARGUMENT")
    assert f"output '{STATE[1]}' of model 'gpt2_decoder_stateful' is its sequences' state" in message
    # Neither refusal touched the sequence: it goes on from its 6 positions.
    _step(client, model, [5], 6, 41, end=True)


def _metrics(server):
    port = int(server.await_output(r"event=listening .*metrics_port=(\d+)"))
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return r.read().decode()


def _metric(text, name, **labels):
    series = name + ("{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}" if labels else "")
    match = re.search(rf"^{re.escape(series)} (\S+)$", text, re.M)
    assert match, f"{series} not exported"
    return float(match.group(1))


# Room for one sequence of 6 positions (4 tensors of 1 x 4 x 6 x 16 float32:
# 6 KiB, and 1 KiB of the sequence's own), not for two.
BUDGET = 12_000


@pytest.fixture(scope="module")
def small_server(tmp_path_factory):
    repository = tmp_path_factory.mktemp("small")
    config = STATEFUL_CONFIG.read_text()
    add_model(repository, "decoder", "gpt2_decoder", config)
    # Triton's default idle limit (a second): the config says none.
    add_model(repository, "decoder_short_idle", "gpt2_decoder",
              re.sub(r"max_sequence_idle_microseconds: \d+", "", config))
    process = ServerProcess(ROOT / "server" / "precompile_server", repository,
                            ["--metrics_port=0", f"--sequence_state_bytes={BUDGET}"])
    yield process
    assert process.stop() == 0, process.log()


def test_state_past_the_budget_evicts_the_sequence_idle_longest(small_server):
    client = triton.InferenceServerClient(small_server.address)
    _step(client, "decoder", PROMPT, 0, 1, start=True)
    assert _metric(_metrics(small_server), "precompile_sequence_state_bytes", model="decoder") == \
        4 * HEADS * len(PROMPT) * HEAD_DIM * 4
    _step(client, "decoder", PROMPT, 0, 2, start=True)
    message = _refused(lambda: _step(client, "decoder", [5], len(PROMPT), 1), "FAILED_PRECONDITION")
    assert "sequence 1 of model 'decoder' is not active: it was evicted to keep the server's " \
           f"sequence state within --sequence_state_bytes ({BUDGET}" in message
    # The newer one generates on.
    _step(client, "decoder", [5], len(PROMPT), 2)
    # A sequence whose state alone passes the budget (12 positions) is
    # refused, and evicts nothing.
    message = _refused(lambda: _step(client, "decoder", list(range(1, 13)), 0, 3, start=True),
                       "RESOURCE_EXHAUSTED")
    assert "the state of sequence 3 of model 'decoder' would take 12288 bytes" in message
    assert f"past --sequence_state_bytes ({BUDGET})" in message
    text = _metrics(small_server)
    assert _metric(text, "precompile_sequences_active", model="decoder") == 1
    assert _metric(text, "precompile_sequences_gone_total", model="decoder", reason="evicted") == 1
    assert _metric(text, "precompile_sequence_state_max_bytes") == BUDGET
    _step(client, "decoder", [6], len(PROMPT) + 1, 2, end=True)
    assert _metric(_metrics(small_server), "precompile_sequences_active", model="decoder") == 0


def test_an_idle_sequence_expires(small_server):
    client = triton.InferenceServerClient(small_server.address)
    _step(client, "decoder_short_idle", [1, 2], 0, 5, start=True)
    time.sleep(1.5)
    message = _refused(lambda: _step(client, "decoder_short_idle", [3], 2, 5),
                       "FAILED_PRECONDITION")
    assert "sequence 5 of model 'decoder_short_idle' is not active: it was dropped after 1s " \
           "without a request (max_sequence_idle_microseconds" in message
    text = _metrics(small_server)
    assert _metric(text, "precompile_sequences_gone_total", model="decoder_short_idle",
                   reason="expired") == 1
    assert _metric(text, "precompile_sequences_active", model="decoder_short_idle") == 0


class _EvictsAfter:
    """The real client; after its `calls`-th call, another sequence takes
    the budget and evicts the one it serves, as a replica gone would lose it."""

    def __init__(self, client, calls):
        self._client, self._calls = client, calls

    def get_model_metadata(self, model):
        return self._client.get_model_metadata(model)

    def infer(self, *args, **kwargs):
        result = self._client.infer(*args, **kwargs)
        self._calls -= 1
        if self._calls == 0:
            _step(self._client, "decoder", PROMPT, 0, 99, start=True)
        return result


def test_a_sequence_the_server_lost_is_started_again_with_its_prefix(small_server):
    client = triton.InferenceServerClient(small_server.address)
    evicted = _metric(_metrics(small_server), "precompile_sequences_gone_total", model="decoder",
                      reason="evicted")
    tokens = generate.generate_stateful(_EvictsAfter(client, 3), "decoder", [17, 4], 6,
                                        sequence_id=98)
    assert tokens == _in_process([17, 4], 6)
    assert _metric(_metrics(small_server), "precompile_sequences_gone_total", model="decoder",
                   reason="evicted") >= evicted + 1


def test_the_load_tool_drives_sequences_whose_state_the_server_keeps(server, tmp_path):
    # Each sequence: a prompt of 6 with sequence_start, then one token a
    # request with a mask one longer each time, the last with sequence_end.
    # Any of those wrong and the server refuses the request (a mask that
    # disagrees with the cache, a sequence not started, two clients' steps
    # in one sequence).
    # (Positions of 0 cost what the right ones do.)
    def zeros(*shape):
        return {"shape": list(shape), "datatype": "INT64", "fill": "zeros"}

    mix = [{"name": "generate", "model": STATEFUL[MODEL],
            "inputs": {"input_ids": zeros(1, 6), "position_ids": zeros(1, 6),
                       "attention_mask": {"shape": [1, 6], "datatype": "INT64", "fill": "ones"}},
            "sequence": {"requests": 8,
                         "next_inputs": {"input_ids": zeros(1, 1), "position_ids": zeros(1, 1)},
                         "grow": {"attention_mask": 1}}}]
    (tmp_path / "mix.json").write_text(json.dumps(mix))
    run = subprocess.run(
        [str(ROOT / "client" / "precompile_load"), f"--address={server.address}",
         f"--mix={tmp_path / 'mix.json'}", "--concurrency=1,4", "--requests=64", "--quiet",
         f"--json_out={tmp_path / 'report.json'}"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "SEQUENCES STARTED" in run.stdout
    one, four = json.loads((tmp_path / "report.json").read_text())["phases"]
    for phase in (one, four):
        assert phase["status_codes"] == {"OK": 64}, phase
    # One at a time: 8 whole sequences; four at once: each slot's last may
    # be cut off by the end of the phase.
    assert (one["sequences_started"], one["sequences_completed"]) == (8, 8)
    assert four["sequences_started"] - 4 <= four["sequences_completed"] <= four["sequences_started"]
    assert four["sequences_completed"] >= 4


# GPT-2 behind a wrapper Dynamo gives up on (gpt2_decoder_recentering):
# generation runs the flagged entry's Python eager program at every step,
# and the program passes the cache it is given to the language model's
# frame `lm`, which runs its compiled prefill and decode variants and
# refuses, by name, what they do not cover.

FLAGGED = "gpt2_decoder_recentering"


def test_a_decoder_behind_a_flagged_wrapper_generates_as_model_generate_does(server, client):
    # Recentering shifts each row of logits by one number: the greedy tokens
    # are GPT-2's own, the cache sent back and forth or kept by the server.
    assert generate.generate(client, FLAGGED, PROMPT, 20) == _in_process(PROMPT, 20)
    assert generate.generate_stateful(client, FLAGGED + "_stateful", PROMPT, 20,
                                      sequence_id=71) == _in_process(PROMPT, 20)
    assert server.log().count(f"event=eager_fallback model={FLAGGED} frame=forward") == 1


def test_each_step_behind_the_flagged_wrapper_runs_eagerly_with_the_cache_it_was_sent(client):
    sequence = [int(t) for t in np.random.default_rng(3).integers(0, 1000, 16)]
    steps, outcomes = _steps_sending_the_cache(client, FLAGGED, sequence)
    assert set(outcomes) == {"eager_fallback"}
    with torch.no_grad():
        whole = models.make_gpt2_decoder_recentering()(input_ids=torch.tensor([sequence]))
    np.testing.assert_allclose(steps, whole.logits[0, 5:].numpy(), rtol=1e-4, atol=1e-4)
    # The same with the cache kept by the server: the program gets it from
    # the sequence's state.
    steps = [_step(client, FLAGGED + "_stateful", sequence[:6], 0, 72, start=True)]
    for end in range(7, len(sequence) + 1):
        steps.append(_step(client, FLAGGED + "_stateful", sequence[end - 1:end], end - 1, 72,
                           end=end == len(sequence)))
    np.testing.assert_allclose(np.stack(steps), whole.logits[0, 5:].numpy(), rtol=1e-4, atol=1e-4)
    # Only a prompt of 5 without recentering is the entry's own variant.
    ids = np.array([sequence[:5]], dtype=np.int64)
    result = client.infer(FLAGGED, generate.token_inputs(ids, np.ones_like(ids)),
                          parameters={"recenter_steps": 0})
    assert result.get_response().parameters["precompile_variant"].string_param == "forward#0"


def test_what_the_flagged_wrappers_frame_does_not_cover_is_refused_by_the_frame(client):
    # A batch of two: the frame's variants take one sequence.
    ids = np.array([[5, 6, 7], [8, 9, 10]], dtype=np.int64)
    message = _refusal(lambda: client.infer(FLAGGED, generate.token_inputs(ids, np.ones_like(ids))))
    assert "no captured variant matches this call of frame 'lm'" in message
    # The frame's guards relate the mask to the cache it is passed.
    message = _refusal(lambda: _decode(client, 9, 12, model=FLAGGED))
    assert "attention_mask.size(1): expected past_key_values.key_cache.0.size(2)+1 (10), got 12" in message
    # Positions past the position table are fenced at the frame's dispatch,
    # inside the eager program, as at the entry.
    with pytest.raises(InferenceServerException) as e:
        _decode(client, 128, 129, model=FLAGGED)
    assert e.value.status() == "StatusCode.INVALID_ARGUMENT", e.value.message()
    assert "'position_ids' holds 128 at flat index 0" in e.value.message()
    assert generate.generate(client, FLAGGED, PROMPT[:5], 2) == _in_process(PROMPT[:5], 2)


# Mutual TLS: a sequence belongs to the certificate of the client that
# started it, over either transport.

def _certificates(directory):
    """A CA, a certificate for the server on 127.0.0.1 and two clients'."""
    def run(command):
        subprocess.run(command, shell=True, cwd=directory, check=True, capture_output=True)

    run("openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=test-ca "
        "-keyout ca.key -out ca.crt")
    for who in ("server", "alice", "bob"):
        run(f"openssl req -newkey rsa:2048 -nodes -subj /CN={who} -keyout {who}.key -out {who}.csr")
        (directory / f"{who}.ext").write_text("subjectAltName=IP:127.0.0.1\n")
        run(f"openssl x509 -req -in {who}.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 "
            f"-extfile {who}.ext -out {who}.crt")
    return directory


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory):
    certs = _certificates(tmp_path_factory.mktemp("certs"))
    repository = tmp_path_factory.mktemp("tls")
    add_model(repository, "decoder", "gpt2_decoder", STATEFUL_CONFIG.read_text())
    process = ServerProcess(ROOT / "server" / "precompile_server", repository,
                            [f"--tls_cert={certs / 'server.crt'}", f"--tls_key={certs / 'server.key'}",
                             f"--tls_client_ca={certs / 'ca.crt'}",
                             # Two sequences of a 6-token prompt (7.2 kB each), not three.
                             "--sequence_state_bytes_per_client=16000"])
    process.certs = certs
    yield process
    assert process.stop() == 0, process.log()


def _tls_client(server, who):
    certs = server.certs
    return triton.InferenceServerClient(
        server.address, ssl=True, root_certificates=str(certs / "ca.crt"),
        private_key=str(certs / f"{who}.key"), certificate_chain=str(certs / f"{who}.crt"))


def _https_step(server, who, ids, past, sequence_id):
    """_step over HTTPS with `who`'s certificate, in KServe's JSON."""
    context = ssl.create_default_context(cafile=str(server.certs / "ca.crt"))
    context.load_cert_chain(str(server.certs / f"{who}.crt"), str(server.certs / f"{who}.key"))
    mask = np.ones((1, past + len(ids)), dtype=np.int64)
    inputs = [{"name": name, "shape": list(value.shape), "datatype": "INT64",
               "data": value.flatten().tolist()}
              for name, value in (("input_ids", np.array([ids], dtype=np.int64)),
                                  ("attention_mask", mask),
                                  ("position_ids", generate.position_ids(mask, len(ids))))]
    body = json.dumps({"inputs": inputs, "parameters": {"sequence_id": sequence_id}}).encode()
    with urllib.request.urlopen(f"https://{server.http_address}/v2/models/decoder/infer", body,
                                timeout=10, context=context) as response:
        [logits] = json.load(response)["outputs"]
    return np.array(logits["data"], dtype=np.float32).reshape(logits["shape"])[0, -1]


def test_a_sequence_is_the_certificates_that_started_it(tls_server):
    alice, bob = _tls_client(tls_server, "alice"), _tls_client(tls_server, "bob")
    sequence = [int(t) for t in np.random.default_rng(4).integers(0, 1000, 9)]
    steps = [_step(alice, "decoder", sequence[:6], 0, 5, start=True)]
    # Bob, knowing the id, can neither continue Alice's sequence...
    message = _refused(lambda: _step(bob, "decoder", [5], 6, 5), "FAILED_PRECONDITION")
    assert "sequence 5 of model 'decoder' is not active" in message
    # ...nor end it by starting his own of the same id.
    _step(bob, "decoder", [7, 8], 0, 5, start=True)
    steps.append(_step(alice, "decoder", sequence[6:7], 6, 5))
    # A certificate is the same client over HTTPS: each goes on with their own.
    steps.append(_https_step(tls_server, "alice", sequence[7:8], 7, 5))
    assert _https_step(tls_server, "bob", [9], 2, 5).shape == (1000,)
    steps.append(_step(alice, "decoder", sequence[8:9], 8, 5, end=True))
    with torch.no_grad():
        whole = models.make_gpt2_decoder()(input_ids=torch.tensor([sequence])).logits[0, 5:].numpy()
    np.testing.assert_allclose(np.stack(steps), whole, rtol=1e-4, atol=1e-4)


def test_a_client_past_its_share_evicts_its_own_sequences(tls_server):
    alice, bob = _tls_client(tls_server, "alice"), _tls_client(tls_server, "bob")
    prompt = PROMPT[:6]
    _step(bob, "decoder", prompt, 0, 21, start=True)  # Idle longest of all.
    for sequence_id in (21, 22, 23):
        _step(alice, "decoder", prompt, 0, sequence_id, start=True)
    message = _refused(lambda: _step(alice, "decoder", [5], 6, 21), "FAILED_PRECONDITION")
    assert ("was evicted to keep its client's sequence state within "
            "--sequence_state_bytes_per_client (16000") in message
    for client, sequence_id in ((bob, 21), (alice, 22), (alice, 23)):
        _step(client, "decoder", [5], 6, sequence_id, end=True)
