#!/usr/bin/env bash
# HTTP/REST beside gRPC on one precompile_server: the same models, the same
# client (Triton's perf_analyzer, from the tritonclient wheel), each point
# measured over gRPC and over HTTP with binary tensors in turn, round after
# round; reported as HTTP's throughput and latency relative to gRPC's
# (medians over rounds). Not JSON tensors: perf_analyzer 2.41 writes 4
# values for an FP32 [8,4] input in JSON, which the server rightly refuses.
#
#   bench/transport_ab.sh          build (--config=opt), run, print the table
#   BUILD=0 bench/transport_ab.sh  reuse the binaries in bazel-out/k8-opt/bin
#
# Models: the examples' mlp (FP32 [8,4] in, [8,3] out: the protocol's own
# cost dominates) and passthrough (FP32 [1024,4] in, 40 KiB out: the tensors'
# encoding shows).
#
# perf_analyzer (from tritonclient 2.41.0's wheel) needs libb64 (Debian:
# libb64-0d) and libcudart.so.12, even on the CPU: the script fetches both
# wheels from PyPI into ~/.cache/precompile-bench/ once and points
# LD_LIBRARY_PATH at the runtime.
#
# Placement as in bench/e2e.sh: the server on $SERVER_CPUS with one torch
# thread and two inference threads, perf_analyzer on $CLIENT_CPUS. 128 HTTP
# threads: at 64 clients perf_analyzer opens more connections than the
# default 64 threads hold, and its extra one times out waiting.
#
# Environment: OUT (results directory), ROUNDS (3), CONCURRENCY ("1 8 64"),
# INTERVAL_MS (3000), SERVER_CPUS (1), CLIENT_CPUS (0), PORT_BASE (28600),
# BUILD (1), BAZEL (bazel), BIN (bazel-out/k8-opt/bin), PA (perf_analyzer).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
OUT=${OUT:-/tmp/precompile-transport-$(date +%Y%m%d-%H%M%S)}
ROUNDS=${ROUNDS:-3}
CONCURRENCY=${CONCURRENCY:-1 8 64}
INTERVAL_MS=${INTERVAL_MS:-3000}
SERVER_CPUS=${SERVER_CPUS:-1}
CLIENT_CPUS=${CLIENT_CPUS:-0}
PORT_BASE=${PORT_BASE:-28600}
BUILD=${BUILD:-1}
BIN=${BIN:-"$ROOT/bazel-out/k8-opt/bin"}
PY="$ROOT/.venv/bin/python"
PA=${PA:-"$HOME/.cache/precompile-bench/tritonclient-2.41/tritonclient-2.41.0.data/data/bin/perf_analyzer"}
GRPC_PORT=$((PORT_BASE + 1))
HTTP_PORT=$((PORT_BASE + 2))

log() { echo "transport_ab: $*" >&2; }
mkdir -p "$OUT"

# perf_analyzer's libraries.
cache="$HOME/.cache/precompile-bench/cu12"
if ! ldconfig -p | grep -q libb64.so.0d; then
  log "perf_analyzer needs libb64: apt-get install libb64-0d"
  exit 2
fi
if [[ ! -f $cache/nvidia/cuda_runtime/lib/libcudart.so.12 ]]; then
  log "fetching libcudart.so.12 (nvidia-cuda-runtime-cu12) for perf_analyzer"
  mkdir -p "$cache"
  "$PY" -m pip download -q --no-deps nvidia-cuda-runtime-cu12==12.9.79 -d "$cache"
  "$PY" -m zipfile -e "$cache"/nvidia_cuda_runtime_cu12-*.whl "$cache"
fi
# perf_analyzer itself left the tritonclient wheel after 2.41 (the
# environment has a newer one, for the Python clients): taken from 2.41's.
if [[ ! -x $PA ]]; then
  log "fetching perf_analyzer (tritonclient 2.41.0's wheel)"
  pa_cache="$HOME/.cache/precompile-bench/tritonclient-2.41"
  mkdir -p "$pa_cache"
  "$PY" -m pip download -q --no-deps --only-binary=:all: --platform manylinux1_x86_64 \
    tritonclient==2.41.0 -d "$pa_cache"
  "$PY" -m zipfile -e "$pa_cache"/tritonclient-2.41.0-*.whl "$pa_cache"
  chmod +x "$PA"
fi
export LD_LIBRARY_PATH="$cache/nvidia/cuda_runtime/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
"$PA" --version > "$OUT/perf_analyzer_version.txt" 2>&1 || true

if [[ "$BUILD" == 1 ]]; then
  log "building (bazel build --config=opt)"
  ${BAZEL:-bazel} build --config=opt --symlink_prefix=/ //server:precompile_server //examples:artifacts
fi
REPO="$OUT/repository"
rm -rf "$REPO"
for m in mlp passthrough; do
  mkdir -p "$REPO/$m"
  cp -rL "$BIN/examples/$m" "$REPO/$m/1"
done
chmod -R u+w "$REPO"

taskset -c "$SERVER_CPUS" "$BIN/server/precompile_server" --model_repository="$REPO" \
  --listen_address=127.0.0.1 --grpc_port="$GRPC_PORT" --http_port="$HTTP_PORT" \
  --metrics_port=-1 --http_threads=128 --torch_threads=1 --inference_threads=2 --log_level=warn \
  > "$OUT/server.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 600); do
  curl -sf "http://127.0.0.1:$HTTP_PORT/v2/health/ready" && break
  sleep 0.2
done

measure() {  # model shape transport concurrency csv
  local model=$1 shape=$2 transport=$3 c=$4 csv=$5 protocol url format=()
  case $transport in
    grpc) protocol=grpc; url=127.0.0.1:$GRPC_PORT ;;
    http_binary) protocol=http; url=127.0.0.1:$HTTP_PORT
                 format=(--input-tensor-format=binary --output-tensor-format=binary) ;;
  esac
  taskset -c "$CLIENT_CPUS" "$PA" -m "$model" -u "$url" -i "$protocol" "${format[@]}" \
    --shape "$shape" --concurrency-range "$c:$c" -p "$INTERVAL_MS" -s 25 -r 6 -f "$csv" \
    >> "$OUT/perf_analyzer.log" 2>&1 || log "perf_analyzer failed: $model $transport c=$c"
}

for r in $(seq "$ROUNDS"); do
  log "round $r of $ROUNDS"
  for spec in mlp:x:8,4 passthrough:x:1024,4; do
    model=${spec%%:*}
    shape=${spec#*:}
    for c in $CONCURRENCY; do
      for transport in grpc http_binary; do
        measure "$model" "$shape" "$transport" "$c" "$OUT/${model}_${transport}_c${c}_r${r}.csv"
      done
    done
  done
done
kill "$SERVER" && wait "$SERVER" 2>/dev/null || true

"$PY" - "$OUT" <<'EOF' | tee "$OUT/summary.md"
import csv, glob, os, re, statistics, sys
out = sys.argv[1]
rows = {}
for path in glob.glob(os.path.join(out, "*_r*.csv")):
    m = re.match(r"(.+)_(grpc|http_binary)_c(\d+)_r\d+\.csv", os.path.basename(path))
    with open(path) as f:
        record = next(csv.DictReader(f), None)
    if m and record:
        key = (m.group(1), int(m.group(3)), m.group(2))
        rows.setdefault(key, []).append((float(record["Inferences/Second"]),
                                         float(record["p50 latency"]), float(record["p99 latency"])))
def med(key, i):
    values = [v[i] for v in rows.get(key, [])]
    return statistics.median(values) if values else float("nan")
print("| model | clients | gRPC req/s | gRPC p50 µs | HTTP req/s (× gRPC) | HTTP p50 µs (× gRPC) "
      "| HTTP p99 µs (× gRPC) |")
print("|---|---|---|---|---|---|---|")
for model in sorted({k[0] for k in rows}):
    for c in sorted({k[1] for k in rows if k[0] == model}):
        g = [med((model, c, "grpc"), i) for i in range(3)]
        h = [med((model, c, "http_binary"), i) for i in range(3)]
        cells = [model, str(c), f"{g[0]:,.0f}", f"{g[1]:,.0f}"]
        cells += [f"{h[i]:,.0f} ({h[i] / g[i]:.2f})" for i in range(3)]
        print("| " + " | ".join(cells) + " |")
print(f"\nmedians over {len(next(iter(rows.values()), []))} rounds; perf_analyzer's p50 and throughput")
EOF
log "done: $OUT"
