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

OUT_PREFIX=/tmp/precompile-grpc-api
ROUNDS=${ROUNDS:-2}
PORT_BASE=${PORT_BASE:-28500}
source "$(dirname "${BASH_SOURCE[0]}")/ab_common.sh"
i=0
for api in sync callback async; do
  PORT[$api]=$((PORT_BASE + i)); i=$((i + 1))
  taskset -c "$SERVER_CPUS" "$BIN/bench/echo_server" --port="${PORT[$api]}" --api="$api" \
    > "$OUT/echo_$api.log" 2>&1 &
  PID[$api]=$!; PIDS+=($!)
done
sleep 2

echo "| round | api | clients | req/s | p50 ms | CPU µs / request | voluntary switches / request |" \
  > "$OUT/summary.md"
echo "|---|---|---|---|---|---|---|" >> "$OUT/summary.md"
for r in $(seq "$ROUNDS"); do
  for api in sync callback async; do
    for c in 1 8 64; do
      read -r _ rps p50 cpu switches < <(load_phase "${PID[$api]}" "${PORT[$api]}" "$c" \
        "$OUT/load_${api}_${c}_r$r.txt")
      echo "| $r | $api | $c | $rps | $p50 | $cpu | $switches |" >> "$OUT/summary.md"
    done
  done
done
cat "$OUT/summary.md"
echo "grpc_api_ab: results in $OUT" >&2
