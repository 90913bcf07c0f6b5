"""Generation through the server three ways: the cache kept by the server
(a stateful model: client/python/generate.py --sequence_id), the cache sent
back and forth (generate.py), and recomputing the prefix each token (what a
model served with use_cache=False costs).

Driven by bench/generation.sh against a running server with the gallery's
decoders (gpt2_decoder: 128 positions at most; llama_decoder: rotary
positions, no table), each also served stateful as <model>_stateful, for
each:

- the cost of one token at PAST positions before it (16, 112 and, for
  Llama, 256), median of ROUNDS calls: kept by the server, the decode steps
  of sequences started with PAST - 10 tokens (the start untimed), 20 steps
  each; sent back and forth, a decode call with a cache of PAST positions;
  recomputing, a prefill call of PAST + 1 tokens;
- tokens per second with SEQUENCES concurrent generations of TOKENS tokens
  after a 16-token prompt, each on its own connection, all three ways; and
  the same prompts as one batch of SEQUENCES rows in one sequence kept by
  the server (one call per token for all of them).

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
    inputs = generate.token_inputs(np.array([[5]], dtype=np.int64),
                                   np.ones((1, past + 1), dtype=np.int64))
    shapes = {i.name: list(i.shape) for i in client.get_model_metadata(model).inputs}
    for name in generate.cache_outputs(client, model):
        shape = [1] + [past if s == -1 else s for s in shapes[name][1:]]  # A batch of 1.
        inputs.append(generate._input(name, rng.standard_normal(shape).astype(np.float32)))
    return statistics.median(_timed(client, model, inputs) for _ in range(ROUNDS))


def stateful_ms(client, model, past):
    # As generation runs: a sequence started with PAST - 10 tokens (untimed),
    # then 20 timed decode steps, from PAST - 10 to PAST + 9 positions before
    # the token; ROUNDS steps in all.
    times = []
    for round_ in range(ROUNDS // 20):
        prompt = [int(t) for t in np.random.default_rng(round_).integers(0, 1000, past - 10)]
        ids = np.array([prompt], dtype=np.int64)
        client.infer(model, generate.token_inputs(ids, np.ones_like(ids)),
                     sequence_id=1, sequence_start=True)
        for step in range(20):
            inputs = generate.token_inputs(np.array([[5]], dtype=np.int64),
                                           np.ones((1, past - 10 + step + 1), dtype=np.int64))
            start = time.perf_counter()
            client.infer(model, inputs, sequence_id=1, sequence_end=step == 19)
            times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def recompute_ms(client, model, length):
    ids = np.random.default_rng(length).integers(0, 1000, (1, length)).astype(np.int64)
    inputs = generate.token_inputs(ids, np.ones_like(ids))
    return statistics.median(_timed(client, model, inputs) for _ in range(ROUNDS))


def generate_recomputing(client, model, prompt, tokens):
    """Greedy generation sending the whole sequence each token."""
    sequence = list(prompt)
    for _ in range(tokens):
        ids = np.array([sequence], dtype=np.int64)
        result = client.infer(model, generate.token_inputs(ids, np.ones_like(ids)),
                              outputs=[triton.InferRequestedOutput("logits")])
        sequence.append(int(np.argmax(result.as_numpy("logits")[0, -1])))
    return sequence[len(prompt):]


WAYS = {
    "kept by the server": lambda c, model, i: generate.generate_stateful(
        c, f"{model}_stateful", PROMPT, TOKENS, sequence_id=i + 1),
    "sent back and forth": lambda c, model, i: generate.generate(c, model, PROMPT, TOKENS),
    "recomputing": lambda c, model, i: generate_recomputing(c, model, PROMPT, TOKENS),
}


# The prompts of all sequences as one batch, kept by the server.
BATCHED = "one batch, kept by the server"


def tokens_per_second(model, sequences, way):
    clients = [triton.InferenceServerClient(ADDRESS) for _ in range(sequences)]
    with concurrent.futures.ThreadPoolExecutor(sequences) as pool:
        start = time.perf_counter()
        done = list(pool.map(lambda i: WAYS[way](clients[i], model, i), range(sequences)))
        seconds = time.perf_counter() - start
    return sum(len(tokens) for tokens in done) / seconds


def batch_tokens_per_second(model, rows):
    """The same prompts as one batch of `rows`, one sequence kept by the
    server: one call per token for all of them."""
    client = triton.InferenceServerClient(ADDRESS)
    start = time.perf_counter()
    done = generate.generate_stateful_batch(client, f"{model}_stateful", [PROMPT] * rows, TOKENS,
                                            sequence_id=1000 + rows)
    return sum(len(tokens) for tokens in done) / (time.perf_counter() - start)


def main():
    client = triton.InferenceServerClient(ADDRESS)
    results = {}
    print("| model | positions before the token | cache kept by the server (ms) "
          "| sent back and forth (ms) | recomputing them (ms) |")
    print("|---|---|---|---|---|")
    for model, pasts in PASTS.items():
        generate.generate(client, model, PROMPT, 4)  # warm up
        generate.generate_stateful(client, f"{model}_stateful", PROMPT, 4, sequence_id=1)
        results[model] = {"per_token_ms": {}, "tokens_per_second": {}}
        for past in pasts:
            kept = stateful_ms(client, f"{model}_stateful", past)
            cached, recomputed = decode_ms(client, model, past), recompute_ms(client, model, past + 1)
            results[model]["per_token_ms"][past] = {
                "kept": kept, "cache": cached, "recompute": recomputed}
            print(f"| {model} | {past} | {kept:.3f} | {cached:.3f} | {recomputed:.3f} |")
    print()
    ways = list(WAYS) + [BATCHED]
    print(f"| model | concurrent sequences | tokens/s ({TOKENS} tokens each after 16): "
          + " | ".join(ways) + " |")
    print("|---|---|" + "---|" * len(ways))
    for model in PASTS:
        for sequences in (1, 8, 64):
            rates = {way: tokens_per_second(model, sequences, way) for way in WAYS}
            rates[BATCHED] = batch_tokens_per_second(model, sequences)
            results[model]["tokens_per_second"][sequences] = rates
            print(f"| {model} | {sequences} | "
                  + " | ".join(f"{rate:.0f}" for rate in rates.values()) + " |")
    with open(sys.argv[2], "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
