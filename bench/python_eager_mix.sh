#!/usr/bin/env bash
# Do Python eager misses hold up variant hits? The GIL serialises Python, not
# the torch operators it calls, and a hit never takes it. One server
# (--config=opt) serves examples' blocks (forward's misses run its Python
# eager program, the blocks their variants) and loop (its misses run a
# TorchScript program, no GIL: the control), on $SERVER_CPUS;
# precompile_load drives it on $CLIENT_CPUS, and reports the latency of the
# hits (outcome "variant") apart from the misses':
#
#   - closed loop, 8 clients: hits only; 3 hits to 1 Python miss; 3 hits to
#     1 TorchScript miss;
#   - open loop, the same hit rate ($HIT_RATE/s) alone, with Python misses
#     at a third of it, and with TorchScript misses at a third of it;
#   - the cost of a miss, one client: examples' loop at n=1 served by its
#     TorchScript program and, captured again with eager="python"
#     (loop_python), by its Python program; n=0 by its variant.
#
# Closed loop keeps the server busy, so a miss's CPU time delays the hits
# queued behind it whatever the interpreter: compare Python with
# TorchScript there. The open loop, below capacity, is where the GIL alone
# would show.
#
#   bench/python_eager_mix.sh
#
# Environment: BIN (opt bin directory with server/precompile_server,
# client/precompile_load, examples/blocks, examples/loop and
# examples/loop_python), OUT, DURATION
# (5), HIT_RATE (400), SERVER_CPUS (1), CLIENT_CPUS (0), PORT (28700),
# SERVER_FLAGS (more server flags, e.g. --eager_nice=0).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=${BIN:-"$ROOT/bazel-out/k8-opt/bin"}
OUT=${OUT:-/tmp/precompile-python-eager-mix-$(date +%Y%m%d-%H%M%S)}
DURATION=${DURATION:-5}
HIT_RATE=${HIT_RATE:-400}
SERVER_CPUS=${SERVER_CPUS:-1}
CLIENT_CPUS=${CLIENT_CPUS:-0}
PORT=${PORT:-28700}
for model in blocks loop loop_python; do
  mkdir -p "$OUT/repository/$model"
  cp -rL "$BIN/examples/$model" "$OUT/repository/$model/1"
done

x='"x": {"shape": [8, 4], "datatype": "FP32", "fill": "random"}'
hit="{\"name\": \"hit\", \"weight\": 3, \"model\": \"blocks\", \"inputs\": {$x}, \"params\": {\"steps\": 0}}"
python_miss="{\"name\": \"python_miss\", \"weight\": 1, \"model\": \"blocks\", \"inputs\": {$x}, \"params\": {\"steps\": 1}}"
torchscript_miss="{\"name\": \"torchscript_miss\", \"weight\": 1, \"model\": \"loop\", \"inputs\": {$x}, \"params\": {\"n\": 1}}"
echo "[$hit]" > "$OUT/hits.json"
echo "[$hit, $python_miss]" > "$OUT/python.json"
echo "[$hit, $torchscript_miss]" > "$OUT/torchscript.json"
for model in loop loop_python; do
  for n in 0 1; do
    echo "[{\"name\": \"$model-$n\", \"model\": \"$model\", \"inputs\": {$x}, \"params\": {\"n\": $n}}]" \
      > "$OUT/$model-$n.json"
  done
done

# The programs carry examples.models by value.
taskset -c "$SERVER_CPUS" "$BIN/server/precompile_server" \
  --allow_python_programs \
  --model_repository="$OUT/repository" --listen_address=127.0.0.1 --grpc_port="$PORT" \
  --metrics_port=-1 --http_port=-1 --torch_threads=1 ${SERVER_FLAGS:-} > "$OUT/server.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
for _ in $(seq 300); do
  grep -q "event=ready" "$OUT/server.log" && break
  sleep 0.2
done
grep -q "event=ready" "$OUT/server.log" || { cat "$OUT/server.log"; exit 1; }

# run NAME MIX LOAD_FLAGS...: one phase, its JSON report in $OUT/NAME.json.
run() {
  local name=$1 mix=$2
  shift 2
  taskset -c "$CLIENT_CPUS" "$BIN/client/precompile_load" --address="127.0.0.1:$PORT" \
    --mix="$OUT/$mix.json" --warmup=1 --duration="$DURATION" --quiet \
    --json_out="$OUT/$name.json" "$@" > "$OUT/$name.txt"
}
run closed_hits hits --concurrency=8
run closed_python python --concurrency=8
run closed_torchscript torchscript --concurrency=8
run open_hits hits --rate="$HIT_RATE"
run open_python python --rate="$((HIT_RATE * 4 / 3))"
run open_torchscript torchscript --rate="$((HIT_RATE * 4 / 3))"
run cost_variant loop-0 --concurrency=1
run cost_torchscript loop-1 --concurrency=1
run cost_python loop_python-1 --concurrency=1

python3 - "$OUT" <<'EOF' | tee "$OUT/summary.md"
import json, sys
out = sys.argv[1]
print("| phase | req/s | hit p50 ms | hit p99 ms | miss p50 ms | misses |")
print("|---|---|---|---|---|---|")
for name in ["closed_hits", "closed_python", "closed_torchscript", "open_hits", "open_python", "open_torchscript"]:
    phase = json.load(open(f"{out}/{name}.json"))["phases"][0]
    by = phase["latency_ms_by_outcome"]
    hit = by["variant"]
    miss = by.get("eager_fallback")
    misses = phase["outcomes"].get("eager_fallback", 0)
    print(f"| {name} | {phase['throughput_rps']:.0f} | {hit['p50']:.3f} | {hit['p99']:.3f} | "
          f"{miss['p50'] if miss else float('nan'):.3f} | {misses} |")
print()
print("| loop, one client, served by | req/s | p50 ms | p99 ms |")
print("|---|---|---|---|")
for name, what in [("cost_variant", "its variant (n=0)"), ("cost_torchscript", "TorchScript (n=1)"),
                   ("cost_python", "Python (n=1)")]:
    phase = json.load(open(f"{out}/{name}.json"))["phases"][0]
    latency = phase["latency_ms"]
    print(f"| {what} | {phase['throughput_rps']:.0f} | {latency['p50']:.3f} | {latency['p99']:.3f} |")
EOF
echo "python_eager_mix: results in $OUT"
