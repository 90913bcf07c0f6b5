#!/usr/bin/env bash
# The hit path, in instructions: callgrind on the running server, counting
# only while N identical small requests (mlp, FP32 [8,4], a variant hit) are
# served one at a time; the same for echo_server (the RPC floor).
# Instruction counts do not depend on what else the machine runs, unlike
# times on a shared machine.
#
#   bench/profile_hit_path.sh                  BUILD=0 BIN=... OUT=... N=1000
#
# Prints instructions per request for each configuration, then where ours'
# go (inclusive, per request), and futex system calls per request (strace -c,
# uninstrumented server). Needs valgrind and strace; takes about 6 minutes.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
OUT=${OUT:-/tmp/precompile-profile-$(date +%Y%m%d-%H%M%S)}
N=${N:-1000}
BUILD=${BUILD:-1}
BIN=${BIN:-"$ROOT/bazel-out/k8-opt/bin"}
PY="$ROOT/.venv/bin/python"
PORT=${PORT:-28701}
mkdir -p "$OUT"
export PYTHONPATH="$ROOT:$BIN"

if [[ "$BUILD" == 1 ]]; then
  ${BAZEL:-bazel} build --config=opt --symlink_prefix=/ //server:precompile_server \
    //bench:echo_server //examples:mlp //proto:python
fi
REPO="$OUT/repo"
rm -rf "$REPO"; mkdir -p "$REPO/mlp"; cp -rL "$BIN/examples/mlp" "$REPO/mlp/1"; chmod -R u+w "$REPO"

ours=("$BIN/server/precompile_server" --model_repository="$REPO" --listen_address=127.0.0.1
      --grpc_port="$PORT" --metrics_port=$((PORT + 1)) --http_port=-1 --torch_threads=1
      --log_level=warn)
echo=("$BIN/bench/echo_server" --port="$PORT")

profile() {  # name server...
  local name=$1; shift
  echo "profile: $name" >&2
  valgrind --tool=callgrind --instr-atstart=no \
    --callgrind-out-file="$OUT/$name.callgrind" "$@" > "$OUT/$name.valgrind.log" 2>&1 &
  local pid=$!
  "$PY" bench/profile_driver.py "$PORT" mlp 8,4 200        # warm up, uninstrumented
  callgrind_control -i on "$pid" > /dev/null
  "$PY" bench/profile_driver.py "$PORT" mlp 8,4 "$N"
  callgrind_control -i off "$pid" > /dev/null
  callgrind_control -d "$pid" > /dev/null
  sleep 1
  kill "$pid"; wait "$pid" 2>/dev/null || true
  # The dump is <name>.callgrind.1; the file named at start gets the (empty)
  # profile written at exit.
  mv "$OUT/$name.callgrind.1" "$OUT/$name.callgrind"
}
profile echo "${echo[@]}"
profile ours "${ours[@]}"

futex() {  # name server...
  local name=$1; shift
  "$@" > "$OUT/$name.strace.log" 2>&1 &
  local pid=$!
  "$PY" bench/profile_driver.py "$PORT" mlp 8,4 300
  strace -f -c -p "$pid" -o "$OUT/$name.strace" 2> /dev/null &
  local st=$!
  sleep 1
  "$PY" bench/profile_driver.py "$PORT" mlp 8,4 2000
  sleep 0.5
  kill -INT "$st"; wait "$st" 2>/dev/null || true
  kill "$pid"; wait "$pid" 2>/dev/null || true
}
futex echo "${echo[@]}"
futex ours "${ours[@]}"

"$PY" - "$OUT" "$N" <<'EOF' | tee "$OUT/profile.md"
import re, subprocess, sys
out, n = sys.argv[1], int(sys.argv[2]) + 1  # the driver's first call is counted too

def total(name):
    with open(f"{out}/{name}.callgrind") as f:
        for line in f:
            if line.startswith("totals:"):
                return int(line.split()[1])

rows = [("echo", "echo_server (RPC floor)"),
        ("ours", "precompile_server")]
base = total("ours")
print("### Instructions per request (callgrind, mlp [8,4], one request at a time)\n")
print("| server | instructions / request | vs precompile_server |")
print("|---|---|---|")
for name, label in rows:
    t = total(name)
    print(f"| {label} | {t / n:,.0f} | {(t - base) / base * 100:+.1f} % |")

text = subprocess.run(["callgrind_annotate", "--threshold=100", "--inclusive=yes",
                       f"{out}/ours.callgrind"], capture_output=True, text=True).stdout
wanted = [
    ("InferenceService::Answer(", "Answer (our handler, all of it)"),
    ("InferenceService::Infer(", "  Infer: parse, decode, call, serialize"),
    ("precompile::LoadedVersion::Call(", "    LoadedVersion::Call"),
    ("precompile::LoadedVersion::Impl::Dispatch(", "      Dispatch (one frame)"),
    ("precompile::Variant::Run(", "        Variant::Run"),
    ("AOTIModelPackageLoader::boxed_run(", "          AOTInductor boxed_run (the model)"),
    ("precompile::FrameDispatcher::Match(", "        FrameDispatcher::Match (guards)"),
    ("precompile::LoadedVersion::Impl::Views(", "        Views (ArgViews for the guards)"),
    ("precompile::LoadedVersion::Impl::Report(", "        Report (counters, observer)"),
    ("at::TensorMaker::make_tensor(", "      at::from_blob (request tensor)"),
    ("grpc::ServerContextBase::IsCancelled(", "  ServerContext::IsCancelled"),
    ("precompile::server::SerializeInferResponse(", "  SerializeInferResponse (the response's bytes)"),
    ("precompile::server::DecodeInput(", "  DecodeInput"),
    ("precompile::server::ModelRepository::Get(", "  ModelRepository::Get"),
    ("ModelMetrics::RecordRequest(", "  ModelMetrics::RecordRequest"),
    ("ModelMetrics::OnFrameCall(", "  ModelMetrics::OnFrameCall"),
    ("absl::debian3::Mutex::Lock()", "absl::Mutex::Lock (all callers, gRPC's included)"),
    ("absl::debian3::Mutex::Unlock()", "absl::Mutex::Unlock (all callers)"),
    ("GraphCycles::GetId(", "  of which GraphCycles::GetId (deadlock detection)"),
    ("malloc.c:malloc ", "malloc (all callers; glibc's, in binaries without tcmalloc)"),
]
print("\n### Where precompile_server's instructions go (inclusive, per request)\n")
print("| function | instructions / request |")
print("|---|---|")
for pattern, label in wanted:
    for line in text.splitlines():
        if pattern in line:
            m = re.match(r"\s*([\d,]+)", line)
            if m:
                print(f"| {label} | {int(m.group(1).replace(',', '')) / n:,.0f} |")
                break

print("\n### System calls per request (strace -c, 2000 requests, uninstrumented)\n")
print("| server | futex / request | futex EAGAIN / request | epoll_wait / request |")
print("|---|---|---|---|")
for name in ("echo", "ours"):
    calls = {}
    with open(f"{out}/{name}.strace") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 5 and parts[-1] in ("futex", "epoll_wait"):
                errors = int(parts[4]) if len(parts) == 6 else 0
                calls[parts[-1]] = (int(parts[3]), errors)
    fu, fe = calls.get("futex", (0, 0))
    ep, _ = calls.get("epoll_wait", (0, 0))
    print(f"| {name} | {fu / 2000:.2f} | {fe / 2000:.2f} | {ep / 2000:.2f} |")
EOF
echo "done: $OUT" >&2
