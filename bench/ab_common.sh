# Sourced by the A/B scripts (grpc_api_ab.sh, server_ab.sh), after they set
# OUT_PREFIX, ROUNDS and PORT_BASE: the environment they share, the small
# model's request mix, and one phase of load against a server process,
# measured from outside it.
#
# Environment: BIN (the opt output directory), OUT, ROUNDS, DURATION (3),
# SERVER_CPUS (1), CLIENT_CPUS (0), PORT_BASE.
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=${BIN:-"$ROOT/bazel-out/k8-opt/bin"}
OUT=${OUT:-$OUT_PREFIX-$(date +%Y%m%d-%H%M%S)}
DURATION=${DURATION:-3}
SERVER_CPUS=${SERVER_CPUS:-1}
CLIENT_CPUS=${CLIENT_CPUS:-0}
mkdir -p "$OUT"
# Examples' mlp, FP32 [8,4] -> [8,3].
printf '[{"name": "small", "model": "mlp", "inputs": {"x": {"shape": [8, 4], "datatype": "FP32", "fill": "random"}}}]\n' \
  > "$OUT/mix.json"
declare -A PID PORT
PIDS=()
trap 'kill "${PIDS[@]}" 2>/dev/null || true' EXIT

#   load_phase PID PORT CONCURRENCY LOG
#
# Runs precompile_load ($BIN/client/precompile_load, on $CLIENT_CPUS, the
# mix $OUT/mix.json for $DURATION seconds after a 0.5 s warmup) against
# 127.0.0.1:PORT, keeps its output in LOG, and prints one line: requests,
# req/s, p50 ms, the server's CPU µs per request and its voluntary context
# switches per request (from /proc; threads that exited are not counted).

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
switches() { cat /proc/"$1"/task/*/status | awk '/^voluntary_ctxt/ {n += $2} END {print n}'; }

load_phase() {
  local pid=$1 port=$2 concurrency=$3 log=$4 t0 s0 t1 s1 n rps p50
  t0=$(cpu_ticks "$pid"); s0=$(switches "$pid")
  taskset -c "$CLIENT_CPUS" "$BIN/client/precompile_load" --address="127.0.0.1:$port" \
    --mix="$OUT/mix.json" --concurrency="$concurrency" --warmup=0.5 --duration="$DURATION" \
    --quiet > "$log"
  t1=$(cpu_ticks "$pid"); s1=$(switches "$pid")
  read -r n rps p50 < <(awk '/^concurrency=/ {print $2, $5, $6}' "$log")
  awk -v n="$n" -v rps="$rps" -v p50="$p50" -v t="$((t1 - t0))" -v s="$((s1 - s0))" \
      -v hz="$(getconf CLK_TCK)" \
    'BEGIN {printf "%s %s %s %.1f %.2f\n", n, rps, p50, t * 1e6 / hz / n, s / n}'
}
