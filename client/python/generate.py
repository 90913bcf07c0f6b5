"""Generating text through precompile-serve with tritonclient: the cache
sent back and forth, or kept by the server.

A decoder captured with its cache (the gallery's `gpt2_decoder`) returns,
besides its logits, the keys and values of every position so far, as
outputs named by their path in the cache: past_key_values.key_cache.<layer>
and past_key_values.value_cache.<layer>. The next call passes them back as
inputs of the same names with only the new token, so each token costs one
position, not the whole prefix. The server keeps nothing between calls.

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
process. It needs only tritonclient and numpy.
"""

import argparse
from typing import Dict, List, Sequence, Union

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


def generate(client: triton.InferenceServerClient, model: str, prompt: Sequence[int],
             tokens: int) -> List[int]:
    """`tokens` tokens after `prompt`, greedily, one call per token."""
    names = cache_outputs(client, model)
    requested = [triton.InferRequestedOutput(name) for name in ["logits"] + names]
    ids = np.asarray([prompt], dtype=np.int64)
    cache: Dict[str, np.ndarray] = {}
    length = 0  # Positions the cache holds.
    out: List[int] = []
    for _ in range(tokens):
        mask = np.ones((1, length + ids.shape[1]), dtype=np.int64)
        inputs = [_input("input_ids", ids), _input("attention_mask", mask)]
        inputs += [_input(name, value) for name, value in cache.items()]
        result = client.infer(model, inputs, outputs=requested)
        token = int(np.argmax(result.as_numpy("logits")[0, -1]))
        out.append(token)
        cache = {name: result.as_numpy(name) for name in names}
        length = mask.shape[1]
        ids = np.asarray([[token]], dtype=np.int64)
    return out


def generate_seq2seq(client: triton.InferenceServerClient, model: str, prompt: Sequence[int],
                     tokens: int, start: int = 0) -> List[int]:
    """`tokens` tokens of an encoder-decoder (the gallery's `t5_decoder`)
    for the input `prompt`, greedily, as generate() does for a decoder: the
    first call encodes the prompt and decodes the start token; each next call
    sends the encoder's output back as encoder_outputs.0, with the cache of
    both attentions and only the new token, so the encoder runs once."""
    names = cache_outputs(client, model)
    requested = [triton.InferRequestedOutput(name) for name in ["logits", ENCODER_OUTPUT] + names]
    mask = _input("attention_mask", np.ones((1, len(prompt)), dtype=np.int64))
    inputs = [_input("input_ids", np.asarray([prompt], dtype=np.int64)), mask]
    token = start
    out: List[int] = []
    for _ in range(tokens):
        inputs.append(_input("decoder_input_ids", np.asarray([[token]], dtype=np.int64)))
        result = client.infer(model, inputs, outputs=requested)
        token = int(np.argmax(result.as_numpy("logits")[0, -1]))
        out.append(token)
        inputs = [mask, _input("encoder_outputs.0", result.as_numpy(ENCODER_OUTPUT))]
        inputs += [_input(name, result.as_numpy(name)) for name in names]
    return out


def generate_seq2seq_stateful(client: triton.InferenceServerClient, model: str,
                              prompt: Sequence[int], tokens: int, sequence_id: Union[int, str],
                              start: int = 0) -> List[int]:
    """As generate_seq2seq(), the encoder's output and the caches kept by
    the server for sequence `sequence_id` (the gallery's
    `t5_decoder_stateful`): the first request carries the prompt, each next
    one only the new token and the mask."""
    mask = _input("attention_mask", np.ones((1, len(prompt)), dtype=np.int64))
    inputs = [_input("input_ids", np.asarray([prompt], dtype=np.int64)), mask]
    token = start
    out: List[int] = []
    for step in range(tokens):
        inputs.append(_input("decoder_input_ids", np.asarray([[token]], dtype=np.int64)))
        result = client.infer(model, inputs, sequence_id=sequence_id, sequence_start=step == 0,
                              sequence_end=step == tokens - 1)
        token = int(np.argmax(result.as_numpy("logits")[0, -1]))
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


def generate_stateful(client: triton.InferenceServerClient, model: str, prompt: Sequence[int],
                      tokens: int, sequence_id: Union[int, str]) -> List[int]:
    """As generate(), the cache kept by the server for sequence
    `sequence_id`: started by the first call, ended by the last. A sequence
    the server no longer holds is started again with everything so far, the
    prompt and the tokens generated, as the server's refusal says to."""
    sequence = list(prompt)
    length = 0  # Positions the server's cache holds.
    for step in range(tokens):
        new = sequence[length:]
        mask = np.ones((1, len(sequence)), dtype=np.int64)
        inputs = [_input("input_ids", np.asarray([new], dtype=np.int64)),
                  _input("attention_mask", mask)]
        try:
            result = client.infer(model, inputs, sequence_id=sequence_id, sequence_start=length == 0,
                                  sequence_end=step == tokens - 1)
        except InferenceServerException as e:
            if length == 0 or not _not_active(e):
                raise
            length = 0
            inputs[0] = _input("input_ids", np.asarray([sequence], dtype=np.int64))
            result = client.infer(model, inputs, sequence_id=sequence_id, sequence_start=True,
                                  sequence_end=step == tokens - 1)
        sequence.append(int(np.argmax(result.as_numpy("logits")[0, -1])))
        length = len(sequence) - 1
    return sequence[len(prompt):]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--address", default="127.0.0.1:8001")
    parser.add_argument("--model", default="gpt2_decoder")
    parser.add_argument("--prompt", default="17,4,99,250,3", help="token ids, comma-separated")
    parser.add_argument("--tokens", type=int, default=8)
    parser.add_argument("--sequence_id", type=int, default=0,
                        help="a stateful model's sequence (a positive integer): the server "
                             "keeps the cache; 0: the cache is sent back and forth")
    args = parser.parse_args()
    client = triton.InferenceServerClient(args.address)
    prompt = [int(t) for t in args.prompt.split(",")]
    if is_encoder_decoder(client, args.model) and args.sequence_id:
        tokens = generate_seq2seq_stateful(client, args.model, prompt, args.tokens, args.sequence_id)
    elif is_encoder_decoder(client, args.model):
        tokens = generate_seq2seq(client, args.model, prompt, args.tokens)
    elif args.sequence_id:
        tokens = generate_stateful(client, args.model, prompt, args.tokens, args.sequence_id)
    else:
        tokens = generate(client, args.model, prompt, args.tokens)
    print(",".join(str(t) for t in tokens))


if __name__ == "__main__":
    main()
