"""Generating text through precompile-serve with tritonclient, the cache
sent back and forth.

A decoder captured with its cache (the gallery's `gpt2_decoder`) returns,
besides its logits, the keys and values of every position so far, as
outputs named by their path in the cache: past_key_values.key_cache.<layer>
and past_key_values.value_cache.<layer>. The next call passes them back as
inputs of the same names with only the new token, so each token costs one
position, not the whole prefix. The server keeps nothing between calls.

    .venv/bin/python client/python/generate.py --address 127.0.0.1:8001 \\
        --model gpt2_decoder --prompt 17,4,99,250,3 --tokens 8

Greedy decoding (the most likely token each step): the tokens equal
`model.generate(input_ids, attention_mask=..., do_sample=False)` run in
process. It needs only tritonclient and numpy.
"""

import argparse
from typing import Dict, List, Sequence

import numpy as np
import tritonclient.grpc as triton

CACHE_PREFIX = "past_key_values."


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--address", default="127.0.0.1:8001")
    parser.add_argument("--model", default="gpt2_decoder")
    parser.add_argument("--prompt", default="17,4,99,250,3", help="token ids, comma-separated")
    parser.add_argument("--tokens", type=int, default=8)
    args = parser.parse_args()
    client = triton.InferenceServerClient(args.address)
    prompt = [int(t) for t in args.prompt.split(",")]
    print(",".join(str(t) for t in generate(client, args.model, prompt, args.tokens)))


if __name__ == "__main__":
    main()
