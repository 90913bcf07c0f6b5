#!/usr/bin/env bash
# Dynamic batching off and on, in one run: a gallery model ($MODEL: bert or
# resnet18) served twice by one precompile_server on one core, as $MODEL (no
# batching) and as ${MODEL}_batched (the same artifact with max_batch_size
# and dynamic_batching in its config.pbtxt), under the same closed-loop load.
#
#   bench/batching.sh          build (--config=opt), run, print the table
#   BUILD=0 bench/batching.sh  reuse the binaries in bazel-out/k8-opt/bin
#
# Requests of $ROWS rows, each served by a dynamic-batch variant alone and
# merged: bert's input_ids and attention_mask, int64 [$ROWS, 11]; resnet18's
# x, float32 [$ROWS, 3, 224, 224]. ROUNDS rounds (3), each: both models at
# each of $CONCURRENCY, one after the other; the median kept. The server gets
# $SERVER_CPUS and one torch thread, the load generator $CLIENT_CPUS. The
# summary also gives the batched model's mean run time per execution (from
# /metrics) and the p99 bound the target sets: 2 x the delay plus one run.
#
# Environment: MODEL (bert), OUT, ROUNDS (3), DURATION (recorded seconds per phase, 3),
# CONCURRENCY (1,8,32), ROWS (2), DELAY_US (2000), MAX_BATCH (64), THREADS (the
# server's --inference_threads, 2),
# SERVER_CPUS (1), CLIENT_CPUS (0), PORT (28121), BUILD (1), BAZEL (bazel).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
MODEL=${MODEL:-bert}
OUT=${OUT:-/tmp/precompile-bench-batching-$(date +%Y%m%d-%H%M%S)}
ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-3}
CONCURRENCY=${CONCURRENCY:-1,8,32}
ROWS=${ROWS:-2}
DELAY_US=${DELAY_US:-2000}
MAX_BATCH=${MAX_BATCH:-64}
THREADS=${THREADS:-2}
SERVER_CPUS=${SERVER_CPUS:-1}
CLIENT_CPUS=${CLIENT_CPUS:-0}
PORT=${PORT:-28121}
METRICS_PORT=$((PORT + 1))
BIN=bazel-out/k8-opt/bin
PY=.venv/bin/python3
mkdir -p "$OUT"
log() { echo "[bench] $*" >&2; }

if [[ "${BUILD:-1}" == 1 ]]; then
  ${BAZEL:-bazel} build --config=opt --symlink_prefix=/ //server:precompile_server //client:precompile_load \
    //client:precompile_client "//gallery:$MODEL"
fi
REPO="$OUT/repository"
rm -rf "$REPO"
BATCHED="${MODEL}_batched"
for model in "$MODEL" "$BATCHED"; do
  mkdir -p "$REPO/$model"
  cp -rL "$BIN/gallery/$MODEL" "$REPO/$model/1"
done
cat > "$REPO/$BATCHED/config.pbtxt" <<EOF
max_batch_size: $MAX_BATCH
dynamic_batching { max_queue_delay_microseconds: $DELAY_US }
EOF

for model in "$MODEL" "$BATCHED"; do
  case $MODEL in
    bert) cat > "$OUT/mix_$model.json" <<EOF
[{"name": "${model}_${ROWS}x11", "model": "$model", "outputs": ["last_hidden_state", "pooler_output"],
  "inputs": {"input_ids": {"shape": [$ROWS, 11], "datatype": "INT64", "fill": 7},
             "attention_mask": {"shape": [$ROWS, 11], "datatype": "INT64", "fill": "ones"}}}]
EOF
      ;;
    resnet18) cat > "$OUT/mix_$model.json" <<EOF
[{"name": "${model}_${ROWS}x3x224x224", "model": "$model",
  "inputs": {"x": {"shape": [$ROWS, 3, 224, 224], "datatype": "FP32", "fill": "random"}}}]
EOF
      ;;
    *) log "MODEL is bert or resnet18, not $MODEL"; exit 2 ;;
  esac
done

log "starting precompile_server on :$PORT"
taskset -c "$SERVER_CPUS" "$BIN/server/precompile_server" --model_repository="$REPO" \
  --listen_address=127.0.0.1 --grpc_port="$PORT" --metrics_port="$METRICS_PORT" --http_port=-1 \
  --torch_threads=1 --inference_threads="$THREADS" --log_level=warn > "$OUT/server.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 300); do
  "$BIN/client/precompile_client" --address="127.0.0.1:$PORT" health > /dev/null 2>&1 && break
  kill -0 $SERVER 2>/dev/null || { log "the server exited: $OUT/server.log"; exit 1; }
  sleep 0.1
done

for r in $(seq "$ROUNDS"); do
  for model in "$MODEL" "$BATCHED"; do
    log "round $r of $ROUNDS: $model at $CONCURRENCY"
    taskset -c "$CLIENT_CPUS" "$BIN/client/precompile_load" --address="127.0.0.1:$PORT" \
      --mix="$OUT/mix_$model.json" --concurrency="$CONCURRENCY" --warmup=1 \
      --duration="$DURATION" --quiet --json_out="$OUT/${model}_r$r.json" > "$OUT/${model}_r$r.txt"
  done
done
curl -s "http://127.0.0.1:$METRICS_PORT/metrics" > "$OUT/metrics.txt"
# Gone before the next run takes the port.
kill $SERVER
wait $SERVER || true

"$PY" - "$OUT" "$ROUNDS" "$DELAY_US" "$MODEL" <<'EOF' | tee "$OUT/summary.md"
import json, re, statistics, sys
out, rounds, delay_us, plain = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
batched = plain + "_batched"
rows = {}
for model in (plain, batched):
    for r in range(1, rounds + 1):
        for phase in json.load(open(f"{out}/{model}_r{r}.json"))["phases"]:
            assert phase["errors"] == 0, phase
            rows.setdefault((model, phase["concurrency"]), []).append(
                (phase["latency_ms"]["p50"], phase["latency_ms"]["p99"], phase["throughput_rps"]))
median = {k: tuple(statistics.median(x[i] for x in v) for i in range(3)) for k, v in rows.items()}

def metric(name, model):
    pattern = re.compile(rf'^{name}\{{[^}}]*model="{model}"[^}}]*\}} (\S+)$', re.M)
    return sum(float(v) for v in pattern.findall(open(f"{out}/metrics.txt").read()))

runs = metric("precompile_batch_rows_count", batched)
rows_run = metric("precompile_batch_rows_sum", batched)
run_s = metric("precompile_execution_duration_seconds_sum", batched)
run_n = metric("precompile_execution_duration_seconds_count", batched)
run_ms = 1e3 * run_s / run_n if run_n else float("nan")
bound_ms = 2 * delay_us / 1e3 + run_ms
print(f"delay {delay_us} µs; {batched} ran {runs:.0f} times, {rows_run / runs:.1f} rows "
      f"per run on average, {run_ms:.2f} ms per run; p99 bound 2 x delay + one run = {bound_ms:.1f} ms\n")
print("| clients | off req/s | on req/s | on/off | off p50 ms | on p50 ms | off p99 ms | on p99 ms |")
print("|---|---|---|---|---|---|---|---|")
for c in sorted({c for _, c in median}):
    off, on = median[(plain, c)], median[(batched, c)]
    print(f"| {c} | {off[2]:.0f} | {on[2]:.0f} | {on[2] / off[2]:.2f} | {off[0]:.2f} | {on[0]:.2f} "
          f"| {off[1]:.2f} | {on[1]:.2f} |")
EOF
log "results in $OUT"
