#!/usr/bin/env bash
# End to end, in one run: precompile_server against the limit, the RPC floor
# and a Python peer, the eager-fallback cost, and a memory soak.
#
#   bench/e2e.sh                 build (--config=opt), run everything, print the summary
#   BUILD=0 bench/e2e.sh         reuse the binaries already in bazel-out/k8-opt/bin
#
# What runs (results under $OUT, summary in $OUT/summary.md):
#   - three servers at once, each on $SERVER_CPUS, each serving the small model
#     (examples' mlp: FP32 [8,4] -> [8,3]) and bench's medium MLP
#     (256-1024-1024-256, FP32 [32,256] -> [32,256]):
#       ours:   precompile_server (--config=opt), with the loop example too
#       echo:   bench's echo_server, the RPC floor (ModelInfer copying the
#               request tensor into the response, no model; same sizes)
#       python: bench/python_kserve_server.py, the Python peer (grpcio +
#               torch.compile)
#   - $ROUNDS rounds, each: precompile_load at concurrency $CONCURRENCY on
#     every (server, model), interleaved; the limit, aoti_direct_bench (the
#     same .pt2 through AOTInductor's loader, in process, 1/8/64 threads); the
#     loop example's n=0 (variant) and n=1 (eager fallback) at concurrency 1.
#     The summary takes the median over rounds, so that load from other
#     processes on a shared machine spreads over all servers alike.
#   - once: the runtime's layers in process (AOTInductor's loader,
#     precompile::Variant::Run, precompile::LoadedVersion::Call) and LoadedVersion::Call on
#     the loop example's variant and eager fallback;
#   - a soak: a mix of every outcome (variant, dynamic variant, eager,
#     refused) at concurrency 8 for $SOAK seconds, VmRSS sampled each second;
#   - bench/summarize.py: tables of ratios and the targets, met or not;
#   - HTTP/REST beside gRPC (bench/transport_ab.sh, perf_analyzer on both
#     transports of one server), appended to the summary; TRANSPORT=0 skips it.
#
# Placement: every server (and aoti_direct_bench) runs on the cores in
# $SERVER_CPUS with one torch thread; the load generator runs on $CLIENT_CPUS.
# On the 2-core development machine that is one core each.
#
# Environment: OUT (results directory), ROUNDS (3), DURATION (recorded seconds
# per phase, 3), WARMUP (1), DIRECT_DURATION (2), SOAK (seconds, 90),
# CONCURRENCY (1,8,64), SERVER_CPUS (1), CLIENT_CPUS (0), PORT_BASE (28000),
# TRANSPORT (1),
# BUILD (1), BAZEL (bazel; e.g. "bazel --output_base=DIR"), BIN (the opt
# output directory, default bazel-out/k8-opt/bin).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
OUT=${OUT:-/tmp/precompile-bench-$(date +%Y%m%d-%H%M%S)}
DURATION=${DURATION:-3}
WARMUP=${WARMUP:-1}
ROUNDS=${ROUNDS:-3}
DIRECT_DURATION=${DIRECT_DURATION:-2}
SOAK=${SOAK:-90}
CONCURRENCY=${CONCURRENCY:-1,8,64}
SERVER_CPUS=${SERVER_CPUS:-1}
CLIENT_CPUS=${CLIENT_CPUS:-0}
PORT_BASE=${PORT_BASE:-28000}
BUILD=${BUILD:-1}
PY="$ROOT/.venv/bin/python"
BIN=${BIN:-"$ROOT/bazel-out/k8-opt/bin"}

OURS_PORT=$((PORT_BASE + 1))
METRICS_PORT=$((PORT_BASE + 2))
ECHO_PORT=$((PORT_BASE + 101))
PEER_PORT=$((PORT_BASE + 201))

log() { echo "e2e: $*" >&2; }

if [[ "$BUILD" == 1 ]]; then
  log "building (bazel build --config=opt)"
  # --symlink_prefix=/ leaves the bazel-bin symlink alone for everyone else.
  ${BAZEL:-bazel} build --config=opt --symlink_prefix=/ //server:precompile_server \
    //client:precompile_load //bench:aoti_direct_bench //bench:echo_server \
    //bench:medium //examples:mlp //examples:loop //proto:python
fi
for f in server/precompile_server client/precompile_load bench/aoti_direct_bench \
         bench/echo_server bench/medium/MANIFEST.pb examples/mlp/MANIFEST.pb; do
  [[ -e "$BIN/$f" ]] || { log "missing $BIN/$f: run with BUILD=1"; exit 1; }
done

mkdir -p "$OUT"
log "results in $OUT"
export PYTHONPATH="$ROOT:$BIN"

# The machine, for RESULTS.md.
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "commit: $(git rev-parse --short HEAD 2>/dev/null)$(git diff --quiet 2>/dev/null || echo ' (+ uncommitted changes)')"
  echo "cpu: $(lscpu | sed -n 's/^Model name: *//p')"
  echo "cores: $(nproc)"
  echo "memory: $(free -g | awk '/Mem:/{print $2}') GiB"
  echo "kernel: $(uname -r)"
  echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "server cpus: $SERVER_CPUS, client cpus: $CLIENT_CPUS"
  echo "rounds: $ROUNDS, duration per phase: ${DURATION}s (+${WARMUP}s warmup), soak: ${SOAK}s"
} > "$OUT/machine.txt"

# The model repository: <repo>/<model>/1/<artifact>.
REPO="$OUT/repo"
rm -rf "$REPO"
for m in mlp loop; do
  mkdir -p "$REPO/$m"; cp -rL "$BIN/examples/$m" "$REPO/$m/1"
done
mkdir -p "$REPO/medium"; cp -rL "$BIN/bench/medium" "$REPO/medium/1"
chmod -R u+w "$REPO"

# Request mixes (client/request_mix.h).
mix() {  # name model shape params
  printf '[{"name": "%s", "model": "%s", "inputs": {"x": {"shape": %s, "datatype": "FP32", "fill": "random"}}, "params": %s}]\n' \
    "$1" "$2" "$3" "$4" > "$OUT/mix_$1.json"
}
mix small mlp "[8, 4]" "{}"
mix medium medium "[32, 256]" "{}"
mix loop_variant loop "[8, 4]" '{"n": 0}'
mix loop_eager loop "[8, 4]" '{"n": 1}'
cat > "$OUT/mix_soak.json" <<'EOF'
[{"name": "small", "weight": 4, "model": "mlp", "inputs": {"x": {"shape": [8, 4], "datatype": "FP32", "fill": "random"}}},
 {"name": "small_dynamic", "weight": 2, "model": "mlp", "inputs": {"x": {"shape": [13, 4], "datatype": "FP32", "fill": "random"}}},
 {"name": "medium", "weight": 1, "model": "medium", "inputs": {"x": {"shape": [32, 256], "datatype": "FP32", "fill": "random"}}},
 {"name": "eager", "weight": 1, "model": "loop", "inputs": {"x": {"shape": [8, 4], "datatype": "FP32", "fill": "random"}}, "params": {"n": 1}},
 {"name": "refused", "weight": 1, "model": "mlp", "inputs": {"x": {"shape": [1, 4], "datatype": "FP32", "fill": "random"}}}]
EOF

PIDS=()
cleanup() {
  for p in "${PIDS[@]:-}"; do
    [[ -n "$p" ]] && kill "$p" 2>/dev/null || true
  done
}
trap cleanup EXIT

wait_ready() {  # port timeout_s
  "$PY" - "$1" "$2" <<'EOF'
import sys, time, grpc
from proto import inference_pb2, inference_pb2_grpc
port, timeout = sys.argv[1], float(sys.argv[2])
stub = inference_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(f"127.0.0.1:{port}"))
deadline = time.time() + timeout
while time.time() < deadline:
    try:
        if stub.ServerReady(inference_pb2.ServerReadyRequest(), timeout=1).ready:
            sys.exit(0)
    except grpc.RpcError:
        pass
    time.sleep(0.2)
sys.exit(f"nothing ready on port {port} after {timeout} s")
EOF
}

stop() {  # pid
  kill -TERM "$1" 2>/dev/null || true
  for _ in $(seq 100); do kill -0 "$1" 2>/dev/null || return 0; sleep 0.1; done
  kill -KILL "$1" 2>/dev/null || true
}

load() {  # port mix concurrency label [duration]
  local d=${5:-$DURATION}
  log "load: $4 (concurrency $3, ${d}s per phase)"
  taskset -c "$CLIENT_CPUS" "$BIN/client/precompile_load" --address="127.0.0.1:$1" \
    --mix="$OUT/mix_$2.json" --concurrency="$3" --warmup="$WARMUP" --duration="$d" \
    --quiet --json_out="$OUT/load_$4.json" > "$OUT/load_$4.txt"
}

# All three servers run at once, each on $SERVER_CPUS (only the one under load
# is busy), so that their measurements can be interleaved: on a shared
# machine, load from other processes then spreads over all of them alike.
log "starting precompile_server on :$OURS_PORT"
# Two inference threads, as deploy/k8s/base/server.flags sets for two cores:
# pinned to one core, the default (one per usable core) would be one. They
# take calls with the default 2 * 2 + 2 = 6 pollers; the echo gets as many.
taskset -c "$SERVER_CPUS" "$BIN/server/precompile_server" --model_repository="$REPO" \
  --listen_address=127.0.0.1 --grpc_port="$OURS_PORT" --metrics_port="$METRICS_PORT" \
  --http_port=-1 --torch_threads=1 --inference_threads=2 --log_level=warn > "$OUT/server.log" 2>&1 &
SERVER=$!; PIDS+=("$SERVER")
log "starting echo_server on :$ECHO_PORT"
taskset -c "$SERVER_CPUS" "$BIN/bench/echo_server" --port="$ECHO_PORT" --async_threads=6 \
  > "$OUT/echo.log" 2>&1 &
ECHO=$!; PIDS+=("$ECHO")
log "starting python_kserve_server on :$PEER_PORT (torch.compile warmup)"
taskset -c "$SERVER_CPUS" "$PY" bench/python_kserve_server.py --port="$PEER_PORT" \
  --models=mlp,medium --torch_threads=1 --workers=8 > "$OUT/python_server.log" 2>&1 &
PEER=$!; PIDS+=("$PEER")
wait_ready "$OURS_PORT" 120
wait_ready "$ECHO_PORT" 30
wait_ready "$PEER_PORT" 600
grep VmRSS /proc/$SERVER/status | awk '{print $2}' > "$OUT/rss_after_load_kb.txt"

DIRECT="$OUT/direct.jsonl"
rm -f "$DIRECT"
direct() {  # label args...
  local label=$1; shift
  log "in process: $label"
  taskset -c "$SERVER_CPUS" "$BIN/bench/aoti_direct_bench" --torch_threads=1 \
    --duration="$DIRECT_DURATION" --warmup=0.5 --label="$label" --json_out="$DIRECT" "$@" \
    >> "$OUT/direct.txt" 2>&1
}

for r in $(seq "$ROUNDS"); do
  log "round $r of $ROUNDS"
  for model in small medium; do
    load "$OURS_PORT" "$model" "$CONCURRENCY" "ours_${model}_r$r"
    load "$ECHO_PORT" "$model" "$CONCURRENCY" "echo_${model}_r$r"
    load "$PEER_PORT" "$model" "$CONCURRENCY" "python_${model}_r$r"
  done
  # The limit: the same packages called in process, AOTInductor's loader.
  direct "loader_small@r$r" --mode=loader --package="$REPO/mlp/1/frames/forward/0.pt2" \
    --shape=8,4 --threads="$CONCURRENCY"
  direct "loader_medium@r$r" --mode=loader --package="$REPO/medium/1/frames/forward/0.pt2" \
    --shape=32,256 --threads="$CONCURRENCY"
  # Eager fallback vs variant, same shape, through the server.
  load "$OURS_PORT" loop_variant 1 "ours_loop_variant_r$r"
  load "$OURS_PORT" loop_eager 1 "ours_loop_eager_r$r"
done

# The runtime's layers in process, once: Variant::Run and LoadedVersion::Call over the
# loader, and LoadedVersion::Call on the loop example's variant and eager fallback.
for model in small medium; do
  if [[ $model == small ]]; then m=mlp; shape=8,4; else m=medium; shape=32,256; fi
  direct "layers_variant_$model" --mode=variant --package="$REPO/$m/1/frames/forward/0.pt2" \
    --shape=$shape --threads=1
  direct "layers_model_$model" --mode=model --artifact="$REPO/$m/1" --shape=$shape --threads=1
  direct "layers_loader_$model" --mode=loader --package="$REPO/$m/1/frames/forward/0.pt2" \
    --shape=$shape --threads=1
done
direct model_loop_variant --mode=model --artifact="$REPO/loop/1" --shape=8,4 --params=n=0 --threads=1
direct model_loop_eager --mode=model --artifact="$REPO/loop/1" --shape=8,4 --params=n=1 --threads=1
direct model_loop_eager_n0 --mode=model --artifact="$REPO/loop/1" --shape=16,4 --params=n=0 --threads=1

stop "$ECHO"
stop "$PEER"
"$PY" -c "import urllib.request,sys; sys.stdout.write(urllib.request.urlopen('http://127.0.0.1:$METRICS_PORT/metrics').read().decode())" \
  > "$OUT/metrics_before_soak.txt" || true

# The soak: every outcome (variant, dynamic variant, eager, refused), VmRSS each second.
log "soak: ${SOAK}s at concurrency 8, VmRSS each second"
( while kill -0 "$SERVER" 2>/dev/null; do
    echo "$(date +%s.%N) $(awk '/VmRSS/{print $2}' /proc/$SERVER/status 2>/dev/null)"
    sleep 1
  done ) > "$OUT/rss_soak.txt" &
SAMPLER=$!; PIDS+=("$SAMPLER")
load "$OURS_PORT" soak 8 ours_soak "$SOAK"
kill "$SAMPLER" 2>/dev/null || true
"$PY" -c "import urllib.request,sys; sys.stdout.write(urllib.request.urlopen('http://127.0.0.1:$METRICS_PORT/metrics').read().decode())" \
  > "$OUT/metrics.txt" || true
stop "$SERVER"

# 5. Summary.
"$PY" bench/summarize.py "$OUT" | tee "$OUT/summary.md"
if [[ ${TRANSPORT:-1} == 1 ]]; then
  log "HTTP/REST beside gRPC (bench/transport_ab.sh)"
  { echo; echo "## HTTP/REST beside gRPC (perf_analyzer)"; echo; } >> "$OUT/summary.md"
  OUT="$OUT/transport" BUILD=0 BIN="$BIN" ROUNDS="$ROUNDS" SERVER_CPUS="$SERVER_CPUS"     CLIENT_CPUS="$CLIENT_CPUS" bench/transport_ab.sh | tee -a "$OUT/summary.md"
fi
log "done: $OUT"
