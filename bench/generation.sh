#!/usr/bin/env bash
# Generation with the cache kept by the server, with it sent back and forth,
# and recomputing the prefix each token: the gallery's decoders (and the
# same artifacts with gallery/decoder_stateful.config.pbtxt, as
# <model>_stateful) served by precompile_server
# (--config=opt, one torch thread, on $SERVER_CPUS), driven from Python with
# tritonclient on $CLIENT_CPUS (bench/generation.py says what it measures).
#
#   bench/generation.sh          build, run, print the tables
#   BUILD=0 bench/generation.sh  reuse the binaries in bazel-out/k8-opt/bin
#
# Environment: OUT, SERVER_CPUS (1), CLIENT_CPUS (0), PORT (28301), BUILD (1),
# BAZEL (bazel).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
OUT=${OUT:-/tmp/precompile-bench-generation-$(date +%Y%m%d-%H%M%S)}
SERVER_CPUS=${SERVER_CPUS:-1}
CLIENT_CPUS=${CLIENT_CPUS:-0}
PORT=${PORT:-28301}
BIN=bazel-out/k8-opt/bin
MODELS=(gpt2_decoder llama_decoder)

if [[ "${BUILD:-1}" == 1 ]]; then
  ${BAZEL:-bazel} build --config=opt --symlink_prefix=/ //server:precompile_server "${MODELS[@]/#/\/\/gallery:}"
fi
for model in "${MODELS[@]}"; do
  for name in "$model" "${model}_stateful"; do
    mkdir -p "$OUT/repository/$name"
    cp -rL "$BIN/gallery/$model" "$OUT/repository/$name/1"
  done
  cp gallery/decoder_stateful.config.pbtxt "$OUT/repository/${model}_stateful/config.pbtxt"
done

taskset -c "$SERVER_CPUS" "$BIN/server/precompile_server" \
  --model_repository="$OUT/repository" --listen_address=127.0.0.1 --grpc_port="$PORT" \
  --metrics_port=-1 --http_port=-1 --torch_threads=1 > "$OUT/server.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
for _ in $(seq 300); do
  grep -q "event=ready" "$OUT/server.log" && break
  sleep 0.2
done
grep -q "event=ready" "$OUT/server.log" || { cat "$OUT/server.log"; exit 1; }

taskset -c "$CLIENT_CPUS" .venv/bin/python bench/generation.py "127.0.0.1:$PORT" \
  "$OUT/generation.json" client/python | tee "$OUT/summary.md"
echo "generation: results in $OUT"
