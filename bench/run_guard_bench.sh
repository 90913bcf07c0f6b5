#!/usr/bin/env bash
# Guard dispatch: ours (guard_dispatch_bench, C++) and Dynamo's (dynamo_guards.py)
# on the same guards, in one run, each pinned to the same core.
#
#   bench/run_guard_bench.sh            build, run both, print the comparison table
#   BUILD=0 CPU=1 OUT=/tmp/g bench/run_guard_bench.sh
#
# Environment: OUT (results directory), CPU (core to pin to, default 1),
# REPETITIONS (Google Benchmark repetitions, default 5), BUILD (1), BAZEL
# (bazel; e.g. "bazel --output_base=DIR"), BIN (the opt output directory,
# default bazel-out/k8-opt/bin). Dynamo's side takes about 2 minutes per
# configuration (it compiles 146 cache entries).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
OUT=${OUT:-/tmp/precompile-guards-$(date +%Y%m%d-%H%M%S)}
CPU=${CPU:-1}
REPETITIONS=${REPETITIONS:-5}
BUILD=${BUILD:-1}
BIN=${BIN:-"$ROOT/bazel-out/k8-opt/bin"}
mkdir -p "$OUT"

if [[ "$BUILD" == 1 ]]; then
  ${BAZEL:-bazel} build --config=opt --symlink_prefix=/ //bench:guard_dispatch_bench
fi
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "commit: $(git rev-parse --short HEAD 2>/dev/null)$(git diff --quiet 2>/dev/null || echo ' (+ uncommitted changes)')"
  echo "cpu: $(lscpu | sed -n 's/^Model name: *//p'), pinned to core $CPU"
  echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
} > "$OUT/machine.txt"

echo "guards: C++ (guard_dispatch_bench)" >&2
taskset -c "$CPU" "$BIN/bench/guard_dispatch_bench" \
  --benchmark_repetitions="$REPETITIONS" --benchmark_report_aggregates_only=true \
  --benchmark_min_time=0.2 --benchmark_out="$OUT/guard_bench.json" \
  --benchmark_out_format=json > "$OUT/guard_bench.txt"
echo "guards: Dynamo (dynamo_guards.py)" >&2
taskset -c "$CPU" "$ROOT/.venv/bin/python" bench/dynamo_guards.py \
  --out "$OUT/dynamo.json" > /dev/null 2> "$OUT/dynamo.log"
taskset -c "$CPU" "$ROOT/.venv/bin/python" bench/dynamo_guards.py --cpp-symbolic-shape-guards \
  --out "$OUT/dynamo_cpp.json" > /dev/null 2> "$OUT/dynamo_cpp.log"
"$ROOT/.venv/bin/python" bench/summarize.py --guards "$OUT" | tee "$OUT/summary.md"
echo "done: $OUT" >&2
