#!/usr/bin/env bash
# gRPC's three C++ server APIs on their own: echo_server with --api=sync,
# callback and async (precompile_server's), each on one core, driven by
# precompile_load on the other at concurrency 1, 8 and 64, rounds
# interleaved. Per phase: req/s, p50, and the server's CPU time and voluntary
# context switches per request (from /proc).
#
#   BIN=<opt bin directory> bench/grpc_api_ab.sh     (after bazel build --config=opt
#                                                     //bench:echo_server //client:precompile_load)
#
# Environment: BIN, OUT, ROUNDS (2), DURATION (3), SERVER_CPUS (1),
# CLIENT_CPUS (0), PORT_BASE (28500).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=${BIN:-"$ROOT/bazel-out/k8-opt/bin"}
OUT=${OUT:-/tmp/precompile-grpc-api-$(date +%Y%m%d-%H%M%S)}
ROUNDS=${ROUNDS:-2}
DURATION=${DURATION:-3}
SERVER_CPUS=${SERVER_CPUS:-1}
CLIENT_CPUS=${CLIENT_CPUS:-0}
PORT_BASE=${PORT_BASE:-28500}
mkdir -p "$OUT"
printf '[{"name": "small", "model": "mlp", "inputs": {"x": {"shape": [8, 4], "datatype": "FP32", "fill": "random"}}}]\n' \
  > "$OUT/mix.json"

declare -A PID PORT
PIDS=()
trap 'kill "${PIDS[@]}" 2>/dev/null || true' EXIT
i=0
for api in sync callback async; do
  PORT[$api]=$((PORT_BASE + i)); i=$((i + 1))
  taskset -c "$SERVER_CPUS" "$BIN/bench/echo_server" --port="${PORT[$api]}" --api="$api" \
    > "$OUT/echo_$api.log" 2>&1 &
  PID[$api]=$!; PIDS+=($!)
done
sleep 2

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
switches() { cat /proc/"$1"/task/*/status | awk '/^voluntary_ctxt/ {n += $2} END {print n}'; }

echo "| round | api | clients | req/s | p50 ms | CPU µs / request | voluntary switches / request |" \
  > "$OUT/summary.md"
echo "|---|---|---|---|---|---|---|" >> "$OUT/summary.md"
for r in $(seq "$ROUNDS"); do
  for api in sync callback async; do
    for c in 1 8 64; do
      pid=${PID[$api]}
      t0=$(cpu_ticks "$pid"); s0=$(switches "$pid")
      taskset -c "$CLIENT_CPUS" "$BIN/client/precompile_load" --address="127.0.0.1:${PORT[$api]}" \
        --mix="$OUT/mix.json" --concurrency="$c" --warmup=0.5 --duration="$DURATION" --quiet \
        > "$OUT/load_${api}_${c}_r$r.txt"
      t1=$(cpu_ticks "$pid"); s1=$(switches "$pid")
      read -r n rps p50 < <(awk '/^concurrency=/ {print $2, $5, $6}' "$OUT/load_${api}_${c}_r$r.txt")
      awk -v r="$r" -v a="$api" -v c="$c" -v n="$n" -v rps="$rps" -v p50="$p50" \
          -v t="$((t1 - t0))" -v s="$((s1 - s0))" -v hz="$(getconf CLK_TCK)" \
        'BEGIN {printf "| %s | %s | %s | %s | %s | %.1f | %.2f |\n", r, a, c, rps, p50, t * 1e6 / hz / n, s / n}' \
        >> "$OUT/summary.md"
    done
  done
done
cat "$OUT/summary.md"
echo "grpc_api_ab: results in $OUT" >&2
