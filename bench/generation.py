"""Generation through the server, its cache sent back and forth
(client/python/generate.py), against recomputing the prefix each token.

Driven by bench/generation.sh against a running server with the gallery's
decoders (gpt2_decoder: 128 positions at most; llama_decoder: rotary
positions, no table), for each:

- the cost of one token with the cache, at PAST positions before it (16,
  112 and, for Llama, 256): a
  decode call (input_ids [1, 1], the cache of PAST positions, a mask of
  PAST + 1), median of ROUNDS calls;
- the cost of one token without it, the whole sequence again: a prefill
  call of PAST + 1 tokens (what a model served with use_cache=False does
  for every token);
- tokens per second with SEQUENCES concurrent generations of TOKENS tokens
  after a 16-token prompt, each on its own connection.

Prints a Markdown table; writes the numbers as JSON to argv[2].
"""

import concurrent.futures
import json
import statistics
import sys
import time

import numpy as np
import tritonclient.grpc as triton

sys.path.insert(0, sys.argv[3])  # client/python
import generate  # noqa: E402

ADDRESS = sys.argv[1]
PASTS = {"gpt2_decoder": (16, 112), "llama_decoder": (16, 112, 256)}
ROUNDS = 200
TOKENS = 32
PROMPT = [int(t) for t in np.random.default_rng(0).integers(0, 1000, 16)]


def _timed(client, model, inputs):
    start = time.perf_counter()
    client.infer(model, inputs)
    return (time.perf_counter() - start) * 1e3


def decode_ms(client, model, past):
    rng = np.random.default_rng(past)
    inputs = [generate._input("input_ids", np.array([[5]], dtype=np.int64)),
              generate._input("attention_mask", np.ones((1, past + 1), dtype=np.int64))]
    shapes = {i.name: list(i.shape) for i in client.get_model_metadata(model).inputs}
    for name in generate.cache_outputs(client, model):
        shape = [past if s == -1 else s for s in shapes[name]]
        inputs.append(generate._input(name, rng.standard_normal(shape).astype(np.float32)))
    return statistics.median(_timed(client, model, inputs) for _ in range(ROUNDS))


def recompute_ms(client, model, length):
    ids = np.random.default_rng(length).integers(0, 1000, (1, length)).astype(np.int64)
    inputs = [generate._input("input_ids", ids), generate._input("attention_mask", np.ones_like(ids))]
    return statistics.median(_timed(client, model, inputs) for _ in range(ROUNDS))


def tokens_per_second(model, sequences):
    clients = [triton.InferenceServerClient(ADDRESS) for _ in range(sequences)]
    with concurrent.futures.ThreadPoolExecutor(sequences) as pool:
        start = time.perf_counter()
        done = list(pool.map(lambda c: generate.generate(c, model, PROMPT, TOKENS), clients))
        seconds = time.perf_counter() - start
    return sum(len(tokens) for tokens in done) / seconds


def main():
    client = triton.InferenceServerClient(ADDRESS)
    results = {}
    print("| model | positions before the token | with the cache (ms) | recomputing them (ms) |")
    print("|---|---|---|---|")
    for model, pasts in PASTS.items():
        generate.generate(client, model, PROMPT, 4)  # warm up
        results[model] = {"per_token_ms": {}, "tokens_per_second": {}}
        for past in pasts:
            cached, recomputed = decode_ms(client, model, past), recompute_ms(client, model, past + 1)
            results[model]["per_token_ms"][past] = {"cache": cached, "recompute": recomputed}
            print(f"| {model} | {past} | {cached:.3f} | {recomputed:.3f} |")
    print()
    print(f"| model | concurrent sequences | tokens/s ({TOKENS} tokens each after 16, cache sent back and forth) |")
    print("|---|---|---|")
    for model in PASTS:
        for sequences in (1, 8, 64):
            rate = tokens_per_second(model, sequences)
            results[model]["tokens_per_second"][sequences] = rate
            print(f"| {model} | {sequences} | {rate:.0f} |")
    with open(sys.argv[2], "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
