#!/usr/bin/env bash
# The gallery's BERT served through precompile_server, against the same
# artifact called in process (precompile::LoadedVersion::Call) and the same variant
# through AOTInductor's loader alone.
#
#   bench/gallery_bert.sh          build (--config=opt), run, print the table
#   BUILD=0 bench/gallery_bert.sh  reuse the binaries in bazel-out/k8-opt/bin
#
# Calls: input_ids and attention_mask, int64 [3, 11]: the dynamic variant
# forward#1 (batch and sequence the capture never saw). The server and the
# in-process runs get $SERVER_CPUS and one torch thread; the load generator
# runs on $CLIENT_CPUS. ROUNDS rounds (3) of each at concurrency 1 and 8, the
# median kept; results and a summary.md under $OUT.
#
# Environment: OUT, ARTIFACT (the gallery's bert), ROUNDS (3), DURATION
# (recorded seconds per phase, 3), SERVER_CPUS (1), CLIENT_CPUS (0), PORT
# (28101), BUILD (1), BAZEL (bazel).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
OUT=${OUT:-/tmp/precompile-bench-bert-$(date +%Y%m%d-%H%M%S)}
ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-3}
SERVER_CPUS=${SERVER_CPUS:-1}
CLIENT_CPUS=${CLIENT_CPUS:-0}
PORT=${PORT:-28101}
BIN=bazel-out/k8-opt/bin
PY=.venv/bin/python3
SHAPE=3x11
mkdir -p "$OUT"
log() { echo "[bench] $*" >&2; }

if [[ "${BUILD:-1}" == 1 ]]; then
  ${BAZEL:-bazel} build --config=opt --symlink_prefix=/ //server:precompile_server //client:precompile_load \
    //bench:aoti_direct_bench //gallery:bert
fi
ARTIFACT=${ARTIFACT:-$BIN/gallery/bert}
REPO="$OUT/repository"
rm -rf "$REPO"
mkdir -p "$REPO/bert"
cp -rL "$ARTIFACT" "$REPO/bert/1"

cat > "$OUT/mix.json" <<EOF
[{"name": "bert_${SHAPE}", "model": "bert", "outputs": ["last_hidden_state", "pooler_output"],
  "inputs": {"input_ids": {"shape": [3, 11], "datatype": "INT64", "fill": 7},
             "attention_mask": {"shape": [3, 11], "datatype": "INT64", "fill": "ones"}}}]
EOF

log "starting precompile_server on :$PORT"
taskset -c "$SERVER_CPUS" "$BIN/server/precompile_server" --model_repository="$REPO" \
  --listen_address=127.0.0.1 --grpc_port="$PORT" --metrics_port=-1 --http_port=-1 --torch_threads=1 \
  --inference_threads=2 --log_level=warn > "$OUT/server.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 200); do
  "$BIN/client/precompile_client" --address="127.0.0.1:$PORT" health > /dev/null 2>&1 && break
  sleep 0.1
done

INPUTS="input_ids:int64:$SHAPE;attention_mask:int64:$SHAPE"
for r in $(seq "$ROUNDS"); do
  log "round $r of $ROUNDS"
  taskset -c "$CLIENT_CPUS" "$BIN/client/precompile_load" --address="127.0.0.1:$PORT" \
    --mix="$OUT/mix.json" --concurrency=1,8 --warmup=1 --duration="$DURATION" --quiet \
    --json_out="$OUT/served_r$r.json" > "$OUT/served_r$r.txt"
  for mode in model loader; do
    args=(--artifact="$ARTIFACT")
    [[ $mode == loader ]] && args=(--package="$ARTIFACT/frames/forward/1.pt2")
    taskset -c "$SERVER_CPUS" "$BIN/bench/aoti_direct_bench" --mode=$mode "${args[@]}" \
      --inputs="$INPUTS" --threads=1,8 --torch_threads=1 --duration="$DURATION" \
      --label="${mode}_r$r" --json_out="$OUT/direct.jsonl" >> "$OUT/direct.txt" 2>&1
  done
done

"$PY" - "$OUT" "$ROUNDS" <<'EOF' | tee "$OUT/summary.md"
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
rows = {}
for r in range(1, rounds + 1):
    for phase in json.load(open(f"{out}/served_r{r}.json"))["phases"]:
        assert phase["errors"] == 0, phase
        rows.setdefault(("served (gRPC, precompile_load)", phase["concurrency"]), []).append(
            (phase["latency_ms"]["p50"] * 1e3, phase["latency_ms"]["p99"] * 1e3, phase["throughput_rps"]))
for line in open(f"{out}/direct.jsonl"):
    d = json.loads(line)
    assert d["errors"] == 0, d
    what = {"model": "in process (LoadedVersion::Call)", "loader": "AOTInductor loader alone"}[d["mode"]]
    rows.setdefault((what, d["threads"]), []).append((d["p50_us"], d["p99_us"], d["throughput_cps"]))
print("| path | concurrency | p50 µs | p99 µs | calls/s |")
print("|---|---|---|---|---|")
median = {k: tuple(statistics.median(x[i] for x in v) for i in range(3)) for k, v in rows.items()}
for (what, c), (p50, p99, rate) in sorted(median.items(), key=lambda kv: (kv[0][1], kv[0][0])):
    print(f"| {what} | {c} | {p50:.0f} | {p99:.0f} | {rate:.0f} |")
for c in (1, 8):
    served = median[("served (gRPC, precompile_load)", c)][0]
    inproc = median[("in process (LoadedVersion::Call)", c)][0]
    print(f"\nconcurrency {c}: served p50 / in-process p50 = {served / inproc:.2f}")
EOF
log "results in $OUT"
