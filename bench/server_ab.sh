#!/usr/bin/env bash
# Two builds of precompile_server side by side on the hit path: each serves
# examples' mlp (FP32 [8,4] -> [8,3]) on $SERVER_CPUS with one torch thread,
# precompile_load drives them in turn on $CLIENT_CPUS at concurrency 1, 8 and
# 64, rounds interleaved so that noise from other processes falls on both,
# and which build goes first alternating by round (on the 2-core development
# machine the first of a pair is measured ~3 % faster whichever it is).
# Per phase: req/s, p50, and the server's CPU time per request
# (bench/ab_common.sh).
# For a change to the serving path: build the server before and after it
# (bazel build --config=opt) and keep both binaries.
#
#   bench/server_ab.sh BEFORE_BINARY AFTER_BINARY
#
# Prints every phase, and per build and concurrency the round with the
# median req/s.
# Environment: BIN (opt bin directory holding client/precompile_load and
# examples/mlp), OUT, ROUNDS (4), DURATION (3), SERVER_CPUS (1),
# CLIENT_CPUS (0), PORT_BASE (28600).
set -euo pipefail

if (($# != 2)); then
  echo "usage: bench/server_ab.sh BEFORE_BINARY AFTER_BINARY" >&2
  exit 2
fi
OUT_PREFIX=/tmp/precompile-server-ab
ROUNDS=${ROUNDS:-4}
PORT_BASE=${PORT_BASE:-28600}
source "$(dirname "${BASH_SOURCE[0]}")/ab_common.sh"
declare -A SERVER=([before]=$1 [after]=$2)
mkdir -p "$OUT/repository/mlp"
cp -rL "$BIN/examples/mlp" "$OUT/repository/mlp/1"
i=0
for build in before after; do
  PORT[$build]=$((PORT_BASE + i)); i=$((i + 1))
  taskset -c "$SERVER_CPUS" "${SERVER[$build]}" --model_repository="$OUT/repository" \
    --listen_address=127.0.0.1 --grpc_port="${PORT[$build]}" --metrics_port=-1 --http_port=-1 \
    --torch_threads=1 --inference_threads=1 > "$OUT/server_$build.log" 2>&1 &
  PID[$build]=$!; PIDS+=($!)
done
for build in before after; do
  for _ in $(seq 100); do
    grep -q "event=ready" "$OUT/server_$build.log" && break
    sleep 0.2
  done
done

echo "| round | build | clients | req/s | p50 ms | CPU µs / request |" > "$OUT/summary.md"
echo "|---|---|---|---|---|---|" >> "$OUT/summary.md"
for r in $(seq "$ROUNDS"); do
  order="before after"
  ((r % 2 == 0)) && order="after before"
  for c in 1 8 64; do
    for build in $order; do
      read -r _ rps p50 cpu _ < <(load_phase "${PID[$build]}" "${PORT[$build]}" "$c" \
        "$OUT/load_${build}_${c}_r$r.txt")
      echo "| $r | $build | $c | $rps | $p50 | $cpu |" >> "$OUT/summary.md"
    done
  done
done
{
  echo
  echo "The round with the median req/s, of $ROUNDS:"
  echo
  echo "| build | clients | req/s | p50 ms | CPU µs / request |"
  echo "|---|---|---|---|---|"
  for c in 1 8 64; do
    for build in before after; do
      awk -F'|' -v b=" $build " -v c=" $c " '$3 == b && $4 == c {print $5, $6, $7}' "$OUT/summary.md" |
        sort -n | awk -v b="$build" -v c="$c" '{rps[NR] = $1; p50[NR] = $2; cpu[NR] = $3}
          END {m = int((NR + 1) / 2); printf "| %s | %s | %s | %s | %s |\n", b, c, rps[m], p50[m], cpu[m]}'
    done
  done
} > "$OUT/medians.md"
cat "$OUT/summary.md" "$OUT/medians.md"
echo "server_ab: results in $OUT" >&2
