"""Generating text through precompile-serve with tritonclient: the cache
sent back and forth, or kept by the server.

A decoder captured with its cache (the gallery's `gpt2_decoder`) returns,
besides its logits, the keys and values of every position so far, as
outputs named by their path in the cache: past_key_values.key_cache.<layer>
and past_key_values.value_cache.<layer>. The next call passes them back as
inputs of the same names with only the new token, so each token costs one
position, not the whole prefix. The server keeps nothing between calls. A
decoder captured without its cache (the gallery's `gpt2`) is sent the whole
sequence so far every step instead.

    .venv/bin/python client/python/generate.py --address 127.0.0.1:8001 \\
        --model gpt2_decoder --prompt 17,4,99,250,3 --tokens 8

The same artifact served with `sequence_batching { state [...] }` in its
config.pbtxt (the gallery's `gpt2_decoder_stateful`) keeps each sequence's
cache on the server between its requests: the client sends the new token,
the mask and Triton's sequence parameters, and the cache never crosses the
wire (--sequence_id). A sequence the server no longer holds (idle too long,
evicted for memory, or its server gone) is started again with the whole
sequence so far.

    .venv/bin/python client/python/generate.py --address 127.0.0.1:8001 \\
        --model gpt2_decoder_stateful --sequence_id 7 --prompt 17,4,99,250,3 --tokens 8

An encoder-decoder (the gallery's `t5_decoder`: a model with a
`decoder_input_ids` input) is generated for as model.generate() does: the
first call encodes the prompt and decodes the start token, each next call
sends the encoder's output back as encoder_outputs.0 with the caches of
both attentions and the new token.

    .venv/bin/python client/python/generate.py --address 127.0.0.1:8001 \\
        --model t5_decoder --prompt 17,4,99,250,3 --tokens 8

Greedy decoding (the most likely token each step): the tokens equal
`model.generate(input_ids, attention_mask=..., do_sample=False)` run in
process. Nothing here reads the model's configuration: pass its
eos_token_id as --eos_token (generation stops there, as generate() does),
an encoder-decoder's decoder_start_token_id as --start_token (T5's is
the default, 0; BART's is 2), and a forced_eos_token_id as
--forced_eos_token (BART's and Marian's configs have one: generate() makes it
the last of the tokens asked for). It needs only tritonclient and numpy.
"""

import argparse
from typing import Dict, List, Optional, Sequence, Union

import numpy as np
import tritonclient.grpc as triton
from tritonclient.utils import InferenceServerException

CACHE_PREFIX = "past_key_values."
# What an encoder-decoder's encoder made of the prompt: sent back each step.
ENCODER_OUTPUT = "encoder_last_hidden_state"


def _input(name: str, value: np.ndarray) -> triton.InferInput:
    datatype = "INT64" if value.dtype == np.int64 else "FP32"
    tensor = triton.InferInput(name, list(value.shape), datatype)
    tensor.set_data_from_numpy(np.ascontiguousarray(value))
    return tensor


def cache_outputs(client: triton.InferenceServerClient, model: str) -> List[str]:
    """The model's cache outputs, as its metadata names them."""
    return [o.name for o in client.get_model_metadata(model).outputs if o.name.startswith(CACHE_PREFIX)]


def position_ids(mask: np.ndarray, new: int) -> np.ndarray:
    """The positions of the last `new` tokens, as generate() counts them from
    the attention mask: a token's position is the number of real tokens
    before it, so a left-padded prompt starts at 0 (padding gets 1)."""
    positions = np.cumsum(mask, axis=1) - 1
    positions[mask == 0] = 1
    return positions[:, -new:]


def left_padded(prompts: Sequence[Sequence[int]], pad: int) -> "tuple[np.ndarray, np.ndarray]":
    """The prompts as one batch, shorter ones padded on the left (as
    generate() expects of a decoder), and the attention mask."""
    width = max(len(p) for p in prompts)
    ids = np.asarray([[pad] * (width - len(p)) + list(p) for p in prompts], dtype=np.int64)
    mask = np.asarray([[0] * (width - len(p)) + [1] * len(p) for p in prompts], dtype=np.int64)
    return ids, mask


def _takes(client: triton.InferenceServerClient, model: str, name: str) -> bool:
    return any(i.name == name for i in client.get_model_metadata(model).inputs)


def token_inputs(ids: np.ndarray, mask: np.ndarray, positions: bool = True) -> List[triton.InferInput]:
    """A step's new tokens `ids`, the mask of everything so far and, for a
    model that takes them (`positions`), the new tokens' position_ids."""
    inputs = [_input("input_ids", ids), _input("attention_mask", mask)]
    if positions:
        inputs.append(_input("position_ids", position_ids(mask, ids.shape[1])))
    return inputs


def _ended(rows: Sequence[Sequence[int]], eos: Optional[int]) -> bool:
    """Whether every row has emitted the end-of-sequence token."""
    return eos is not None and all(eos in row for row in rows)


def _chosen(logits: np.ndarray, last: bool, forced_eos: Optional[int]) -> np.ndarray:
    """Each row's next token from its last position's logits: the most
    likely, or `forced_eos` at the last step (generate()'s
    forced_eos_token_id)."""
    chosen = np.argmax(logits[:, -1], axis=-1).astype(np.int64)
    if last and forced_eos is not None:
        chosen[:] = forced_eos
    return chosen


def _cut(rows: Sequence[Sequence[int]], eos: Optional[int]) -> List[List[int]]:
    """Each row up to and including its first end-of-sequence token."""
    return [list(row[:row.index(eos) + 1]) if eos is not None and eos in row else list(row)
            for row in rows]


def generate_batch(client: triton.InferenceServerClient, model: str,
                   prompts: Sequence[Sequence[int]], tokens: int, pad: int = 0,
                   eos: Optional[int] = None, forced_eos: Optional[int] = None) -> List[List[int]]:
    """`tokens` tokens after each of `prompts`, greedily, one call per token
    for the whole batch: the prompts left-padded with `pad`, each row's
    positions counted from its own first token (a model with a
    position_ids input gets them, as generate() passes them). A row ends
    at `eos`, and the calls end once every row has; the last step's token
    is `forced_eos` where one is given. A model that serves no cache gets
    the whole sequence so far each step."""
    names = cache_outputs(client, model)
    # A decoder captured without its cache (use_cache=False) is sent the
    # whole sequence every step: each token costs the whole prefix.
    whole_sequence = not names
    positions = _takes(client, model, "position_ids")
    requested = [triton.InferRequestedOutput(name) for name in ["logits"] + names]
    ids, mask = left_padded(prompts, pad)
    cache: Dict[str, np.ndarray] = {}
    out: List[List[int]] = [[] for _ in prompts]
    for step in range(tokens):
        if _ended(out, eos):
            break
        inputs = token_inputs(ids, mask, positions)
        inputs += [_input(name, value) for name, value in cache.items()]
        result = client.infer(model, inputs, outputs=requested)
        chosen = _chosen(result.as_numpy("logits"), step == tokens - 1, forced_eos)
        for row, token in zip(out, chosen):
            row.append(int(token))
        cache = {name: result.as_numpy(name) for name in names}
        ids = np.concatenate([ids, chosen[:, None]], axis=1) if whole_sequence else chosen[:, None]
        mask = np.concatenate([mask, np.ones((len(prompts), 1), dtype=np.int64)], axis=1)
    return _cut(out, eos)


def generate(client: triton.InferenceServerClient, model: str, prompt: Sequence[int],
             tokens: int, eos: Optional[int] = None, forced_eos: Optional[int] = None) -> List[int]:
    """`tokens` tokens after `prompt`, greedily, one call per token."""
    return generate_batch(client, model, [prompt], tokens, eos=eos, forced_eos=forced_eos)[0]


def generate_seq2seq(client: triton.InferenceServerClient, model: str, prompt: Sequence[int],
                     tokens: int, start: int = 0, eos: Optional[int] = None,
                     forced_eos: Optional[int] = None) -> List[int]:
    """`tokens` tokens of an encoder-decoder (the gallery's `t5_decoder`)
    for the input `prompt`, greedily, as generate() does for a decoder: the
    first call encodes the prompt and decodes the start token; each next call
    sends the encoder's output back as encoder_outputs.0, with the cache of
    both attentions and only the new token, so the encoder runs once.
    `start` is the model's decoder_start_token_id (T5's 0, BART's 2)."""
    names = cache_outputs(client, model)
    requested = [triton.InferRequestedOutput(name) for name in ["logits", ENCODER_OUTPUT] + names]
    mask = _input("attention_mask", np.ones((1, len(prompt)), dtype=np.int64))
    inputs = [_input("input_ids", np.asarray([prompt], dtype=np.int64)), mask]
    token = start
    out: List[int] = []
    for step in range(tokens):
        if _ended([out], eos):
            break
        inputs.append(_input("decoder_input_ids", np.asarray([[token]], dtype=np.int64)))
        result = client.infer(model, inputs, outputs=requested)
        token = int(_chosen(result.as_numpy("logits")[:1], step == tokens - 1, forced_eos)[0])
        out.append(token)
        inputs = [mask, _input("encoder_outputs.0", result.as_numpy(ENCODER_OUTPUT))]
        inputs += [_input(name, result.as_numpy(name)) for name in names]
    return out


def generate_seq2seq_stateful(client: triton.InferenceServerClient, model: str,
                              prompt: Sequence[int], tokens: int, sequence_id: Union[int, str],
                              start: int = 0, eos: Optional[int] = None,
                              forced_eos: Optional[int] = None) -> List[int]:
    """As generate_seq2seq(), the encoder's output and the caches kept by
    the server for sequence `sequence_id` (the gallery's
    `t5_decoder_stateful`): the first request carries the prompt, each next
    one only the new token and the mask."""
    mask = _input("attention_mask", np.ones((1, len(prompt)), dtype=np.int64))
    inputs = [_input("input_ids", np.asarray([prompt], dtype=np.int64)), mask]
    token = start
    out: List[int] = []
    for step in range(tokens):
        if _ended([out], eos):
            # Ended by one more call (generate_stateful_batch()).
            _end_sequence(client, model, sequence_id,
                          inputs + [_input("decoder_input_ids", np.asarray([[token]], dtype=np.int64))])
            break
        inputs.append(_input("decoder_input_ids", np.asarray([[token]], dtype=np.int64)))
        result = client.infer(model, inputs, sequence_id=sequence_id, sequence_start=step == 0,
                              sequence_end=step == tokens - 1)
        token = int(_chosen(result.as_numpy("logits")[:1], step == tokens - 1, forced_eos)[0])
        out.append(token)
        inputs = [mask]
    return out


def is_encoder_decoder(client: triton.InferenceServerClient, model: str) -> bool:
    return any(i.name == "decoder_input_ids" for i in client.get_model_metadata(model).inputs)


def _not_active(error: InferenceServerException) -> bool:
    """The server no longer holds the sequence (it ended, was idle too long,
    was evicted for memory, or the server that held it went away)."""
    return error.status() == "StatusCode.FAILED_PRECONDITION" and \
        "is not active" in (error.message() or "")


def _end_sequence(client: triton.InferenceServerClient, model: str, sequence_id: Union[int, str],
                  inputs: List[triton.InferInput]) -> None:
    """Ends sequence `sequence_id` with one more step (what it computes is
    not kept); one the server no longer holds is ended already."""
    try:
        client.infer(model, inputs, sequence_id=sequence_id, sequence_end=True)
    except InferenceServerException as e:
        if not _not_active(e):
            raise


def generate_stateful_batch(client: triton.InferenceServerClient, model: str,
                            prompts: Sequence[Sequence[int]], tokens: int,
                            sequence_id: Union[int, str], pad: int = 0,
                            eos: Optional[int] = None, forced_eos: Optional[int] = None) -> List[List[int]]:
    """As generate_batch(), the batch's cache kept by the server for sequence
    `sequence_id`: started by the first call, ended by the last. A sequence
    the server no longer holds is started again with everything so far, the
    prompts and the tokens generated, as the server's refusal says to. One
    whose rows all reach `eos` before the last call is ended by one more
    call, whose token is not kept: a sequence's end rides on a request, and
    left to the server's max_sequence_idle_microseconds its cache would be
    held, and counted against the server's memory for sequences, until
    then."""
    positions = _takes(client, model, "position_ids")
    ids, mask = left_padded(prompts, pad)  # Everything so far.
    generated = ids.shape[1]  # Where the generated tokens start.
    held = 0  # Positions the server's cache holds.

    for step in range(tokens):
        if _ended(ids[:, generated:].tolist(), eos):
            if held:
                _end_sequence(client, model, sequence_id,
                              token_inputs(ids[:, held:], mask, positions))
            break
        last = step == tokens - 1
        try:
            result = client.infer(model, token_inputs(ids[:, held:], mask, positions), sequence_id=sequence_id,
                                  sequence_start=held == 0, sequence_end=last)
        except InferenceServerException as e:
            if held == 0 or not _not_active(e):
                raise
            result = client.infer(model, token_inputs(ids, mask, positions), sequence_id=sequence_id,
                                  sequence_start=True, sequence_end=last)
        chosen = _chosen(result.as_numpy("logits"), last, forced_eos)
        held = ids.shape[1]
        ids = np.concatenate([ids, chosen[:, None]], axis=1)
        mask = np.concatenate([mask, np.ones((len(prompts), 1), dtype=np.int64)], axis=1)
    return _cut(ids[:, generated:].tolist(), eos)


def generate_stateful(client: triton.InferenceServerClient, model: str, prompt: Sequence[int],
                      tokens: int, sequence_id: Union[int, str], eos: Optional[int] = None,
                      forced_eos: Optional[int] = None) -> List[int]:
    """As generate(), the cache kept by the server for sequence `sequence_id`."""
    return generate_stateful_batch(client, model, [prompt], tokens, sequence_id, eos=eos,
                                   forced_eos=forced_eos)[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--address", default="127.0.0.1:8001")
    parser.add_argument("--model", default="gpt2_decoder")
    parser.add_argument("--prompt", default="17,4,99,250,3",
                        help="token ids, comma-separated; several prompts (a decoder's batch, "
                             "left-padded) separated by semicolons")
    parser.add_argument("--tokens", type=int, default=8,
                        help="at most this many tokens a prompt")
    parser.add_argument("--eos_token", type=int, default=None,
                        help="the model's eos_token_id: a prompt's tokens end with it, and the "
                             "calls once every prompt's have (model.generate() stops so)")
    parser.add_argument("--forced_eos_token", type=int, default=None,
                        help="the model's forced_eos_token_id (BART, Marian): the last of "
                             "--tokens is this token, as model.generate() makes it")
    parser.add_argument("--start_token", type=int, default=0,
                        help="an encoder-decoder's decoder_start_token_id (T5: 0, BART: 2)")
    parser.add_argument("--sequence_id", type=int, default=0,
                        help="a stateful model's sequence (a positive integer): the server "
                             "keeps the cache; 0: the cache is sent back and forth")
    args = parser.parse_args()
    client = triton.InferenceServerClient(args.address)
    prompts = [[int(t) for t in p.split(",")] for p in args.prompt.split(";")]
    if is_encoder_decoder(client, args.model):
        if len(prompts) > 1:
            parser.error("an encoder-decoder generates for one prompt at a time")
        if args.sequence_id:
            tokens = [generate_seq2seq_stateful(client, args.model, prompts[0], args.tokens,
                                                args.sequence_id, args.start_token, args.eos_token,
                                                args.forced_eos_token)]
        else:
            tokens = [generate_seq2seq(client, args.model, prompts[0], args.tokens, args.start_token,
                                       args.eos_token, args.forced_eos_token)]
    elif args.sequence_id:
        tokens = generate_stateful_batch(client, args.model, prompts, args.tokens, args.sequence_id,
                                         eos=args.eos_token, forced_eos=args.forced_eos_token)
    else:
        tokens = generate_batch(client, args.model, prompts, args.tokens, eos=args.eos_token,
                                forced_eos=args.forced_eos_token)
    for row in tokens:
        print(",".join(str(t) for t in row))


if __name__ == "__main__":
    main()
