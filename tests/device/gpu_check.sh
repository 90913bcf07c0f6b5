#!/usr/bin/env bash
# CUDA check and benchmark, for a machine with an NVIDIA GPU and torch 2.11
# but no Bazel. Its runs (H200, H100) are in bench/RESULTS.md ("CUDA").
#
# Two steps:
#
#   tests/device/gpu_check.sh stage   HERE, after `bazel build --config=opt`
#                                     (or BUILD=1): copies the binaries, the
#                                     generated Python protos and the Debian
#                                     libraries the binaries load into
#                                     tests/device/gpu_bundle/ (git-ignored;
#                                     about 40 MB), to be carried along.
#   tests/device/gpu_check.sh run     THERE, from the repository root, with
#                                     the bundle beside this script. Results
#                                     go to $OUT (or /tmp/precompile-gpu-check):
#                                     gpu_summary.json, and every log and
#                                     report in gpu_check_results.tar.gz
#                                     (two files, whatever stops the run).
#
# What `run` does:
#   1. finds a Python with torch 2.11 and a usable CUDA device ($PYTHON,
#      .venv/bin/python or python3), builds the CPU-only libtorch.so stand-in
#      against that torch (as bazel/torch.bzl does) and points the carried
#      binaries at that torch with LD_LIBRARY_PATH (their run paths name this
#      build machine's paths; LD_LIBRARY_PATH comes first for RUNPATH);
#   2. captures CUDA variants of the bundled examples (mlp, loop, branch,
#      nested), bench's medium MLP and the gallery's BERT, GPT-2, resnet18,
#      and GPT-2 and Llama with their caches (which need transformers and
#      torchvision) with `python -m precompile_capture --device cuda`, all at
#      once; then serves a model whose call can poison the CUDA context
#      (device_lost_model.py) from a server of its own, beside one whose
#      out-of-range indices the capture fences and a compiled EmbeddingBag
#      given offsets that go back by 1e8 (tests/value_indices: those calls
#      must fail alone), poisons it, and checks that the server stops
#      calling itself live and, on SIGTERM, drains and exits 3 (the device
#      lost);
#   3. serves them with the carried precompile_server --device=cuda, BERT
#      and resnet18 also with dynamic batching, the decoders also stateful;
#   4. checks each example call's outputs (served with precompile_client
#      infer; BERT with keyword inputs, by output name) against the same
#      model run eagerly on the CPU in that Python, and how each call was
#      served (variant, eager fallback, refusal): each call alone, then
#      every call four times at once (each on a CUDA stream of its own);
#      and GPT-2 generating 12 tokens for two prompts, its cache sent back
#      and forth and kept by the server (in device memory), against
#      model.generate() on the CPU;
#   5. runs precompile_load at concurrency 1, 8, 64 on mlp, medium, BERT and
#      resnet18 (each unbatched and batched), and sequences of the stateful
#      GPT-2 (requests per second are its tokens per second);
#      aoti_direct_bench --device=cuda on medium, BERT and resnet18 (the
#      in-process limit); bench/generation.py (tokens per second three
#      ways: the cache kept by the server, sent back and forth, the prefix
#      recomputed); the loads of medium, BERT and resnet18 again at 8 and
#      64 clients with --cuda_pinned_staging=false (copies from and to
#      pageable memory), and of BERT batched and resnet18 (both ways) with
#      --grpc_relay_threads=1 (the front's relay on one thread, as before
#      it had several), side by side; and front_relay_bench, what the gRPC
#      front moves on one relay thread and on four, plain and ending TLS
#      (bench/RESULTS.md sections 24, 26). Each of these steps runs, in
#      that order, within what is left of BUDGET_S (540) seconds;
#   6. prints one summary and writes gpu_summary.json.
#
# DEVICE=cpu runs the same steps with CPU artifacts and --device=cpu: a dry
# run of the script's plumbing on any machine (that much was run here).
#
# Exit status: 0 all checks passed; 1 a check failed; 2 the machine cannot run
# it (no GPU, no torch 2.11, a library missing).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BUNDLE="$ROOT/tests/device/gpu_bundle"
cmd=${1:-}

log() { echo "gpu_check: $*" >&2; }

if [[ "$cmd" == stage ]]; then
  cd "$ROOT"
  BIN=${BIN:-"$ROOT/bazel-out/k8-opt/bin"}
  if [[ "${BUILD:-0}" == 1 ]]; then
    ${BAZEL:-bazel} build --config=opt --symlink_prefix=/ //server:precompile_server \
      //client:precompile_load //client:precompile_client //bench:aoti_direct_bench \
      //bench:front_relay_bench //proto:python \
      //runtime:cuda_support_test //runtime:call_binding_test
  fi
  rm -rf "$BUNDLE"
  mkdir -p "$BUNDLE/bin" "$BUNDLE/lib" "$BUNDLE/python/proto"
  for b in server/precompile_server client/precompile_load client/precompile_client \
           bench/aoti_direct_bench bench/front_relay_bench runtime/cuda_support_test \
           runtime/call_binding_test; do
    [[ -x "$BIN/$b" ]] || { log "no $BIN/$b: build with --config=opt first (or BUILD=1)"; exit 1; }
    cp "$BIN/$b" "$BUNDLE/bin/"
  done
  chmod u+w "$BUNDLE"/bin/*
  strip --strip-unneeded "$BUNDLE"/bin/*  # the bundle travels under a size limit
  cp "$BIN"/proto/*_pb2*.py "$BUNDLE/python/proto/"
  touch "$BUNDLE/python/proto/__init__.py"
  # bench/generation.py drives the server with tritonclient (pure Python),
  # whose generated protos need a protobuf at least as new as the venv's:
  # both travel, the protobuf used only where the machine's is older.
  SITE=$("$ROOT/.venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  cp -r "$SITE/tritonclient" "$BUNDLE/python/"
  mkdir -p "$BUNDLE/protobuf/google"
  cp -r "$SITE/google/protobuf" "$SITE/google/_upb" "$BUNDLE/protobuf/google/"
  find "$BUNDLE" -name __pycache__ -prune -exec rm -rf {} +
  # ...and python-rapidjson, built for the GPU machine's Python (3.12).
  "$ROOT/.venv/bin/python" -m pip download -q --no-deps --only-binary=:all: \
    --python-version "${GPU_PYTHON_VERSION:-3.12}" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 -d "$BUNDLE/wheels" \
    "python-rapidjson==$(grep -oP '^python-rapidjson==\K.*' "$ROOT/requirements.lock")"
  # Debian's libraries (gRPC, protobuf, abseil, ...), in case the GPU machine
  # lacks the packages; not glibc, libstdc++ or anything of torch's wheel.
  for b in "$BUNDLE"/bin/*; do ldd "$b"; done | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u |
    while read -r lib; do
      case "$(basename "$lib")" in
        libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|libutil.so*|libgcc_s.so*|\
        libstdc++.so*|ld-linux*|libtorch*|libc10*|libgomp*|libcudart*|libcupti*) continue ;;
      esac
      [[ "$lib" == *site-packages* || "$lib" == *bazel* ]] && continue
      cp -L "$lib" "$BUNDLE/lib/"
    done
  git -C "$ROOT" rev-parse HEAD > "$BUNDLE/COMMIT" 2>/dev/null || true
  log "staged $(du -sh "$BUNDLE" | cut -f1) in $BUNDLE; carry tests/device/gpu_bundle"
  exit 0
fi

if [[ "$cmd" != run ]]; then
  echo "usage: $0 stage | run" >&2
  exit 2
fi

cd "$ROOT"
DEVICE=${DEVICE:-cuda}
FINAL=${OUT:-/tmp/precompile-gpu-check}
W=$(mktemp -d /tmp/precompile-gpu.XXXXXX)
OUT="$W/results"  # packed into $FINAL on exit
mkdir -p "$FINAL" "$OUT"
SERVER=
finish() {
  [[ -n "$SERVER" ]] && kill "$SERVER" 2>/dev/null
  [[ -f "$OUT/gpu_summary.json" ]] && cp "$OUT/gpu_summary.json" "$FINAL/"
  tar -C "$OUT" -czf "$FINAL/gpu_check_results.tar.gz" . 2>/dev/null
  rm -rf "$W"
}
trap finish EXIT
trap 'exit 143' TERM INT  # so that a timeout's signal still packs the results
# A GPU machine's run has a time limit: the steps after the correctness
# checks each run within what is left of BUDGET_S seconds, and are skipped,
# saying so, once it is spent, so that the results come back whatever happens.
BUDGET_S=${BUDGET_S:-540}
within() {  # seconds step command...: runs it for at most its seconds, or what is left
  local cap=$1 step=$2 left=$((BUDGET_S - SECONDS))
  shift 2
  if ((left < 15)); then log "skipped, out of time: $step"; return 1; fi
  ((cap < left)) || cap=$left
  timeout -k 5 "$cap" "$@"
}
[[ -x "$BUNDLE/bin/precompile_server" ]] || { log "no bundle at $BUNDLE: run '$0 stage' on the build machine"; exit 2; }

# 1. Python, torch, CUDA.
PYTHON=${PYTHON:-}
if [[ -z "$PYTHON" ]]; then
  if [[ -x "$ROOT/.venv/bin/python" ]]; then PYTHON="$ROOT/.venv/bin/python"; else PYTHON=python3; fi
fi
TORCH_DIR=$("$PYTHON" - "$DEVICE" <<'EOF'
import os, sys
import torch
if not torch.__version__.startswith("2.11."):
    sys.exit(f"torch {torch.__version__}, not 2.11")
if sys.argv[1] == "cuda" and not torch.cuda.is_available():
    sys.exit("torch.cuda.is_available() is False")
print(os.path.dirname(torch.__file__))
EOF
) || { log "this machine cannot run the check (see above)"; exit 2; }
log "torch at $TORCH_DIR; GPU: $(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null | head -1)"

mkdir -p "$W/cpu_only"
: > "$W/cpu_only/empty.c"
gcc -shared -o "$W/cpu_only/libtorch.so" -Wl,-soname,libtorch.so -Wl,--no-as-needed \
  -L"$TORCH_DIR/lib" -Wl,-rpath,"$TORCH_DIR/lib" -ltorch_cpu -lc10 "$W/cpu_only/empty.c" ||
  { log "cannot build the CPU-only libtorch.so stand-in (gcc?)"; exit 2; }
export LD_LIBRARY_PATH="$W/cpu_only:$TORCH_DIR/lib:$BUNDLE/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
for b in "$BUNDLE"/bin/*; do
  if ldd "$b" | grep -q "not found"; then
    log "$b: $(ldd "$b" | grep "not found" | tr '\n' ' ')"; exit 2
  fi
done
export PYTHONPATH="$ROOT:$ROOT/capture:$ROOT/tests/device:$BUNDLE/python${PYTHONPATH:+:$PYTHONPATH}"
export TORCHINDUCTOR_CACHE_DIR="$W/inductor"

# The runtime's CUDA unit tests that need no artifacts: a call's device and
# stream, outputs left in device memory, copies through pinned buffers.
UNIT=0
{ "$BUNDLE/bin/cuda_support_test" --gtest_filter='CudaCall.*:CudaSupport.LoadsOnDemand*' &&
  "$BUNDLE/bin/call_binding_test" --gtest_filter='HostOutputs.*:BindArguments.*:CudaCopies.*'; } \
  > "$OUT/cuda_unit_tests.txt" 2>&1 || UNIT=1
log "CUDA unit tests: $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$OUT/cuda_unit_tests.txt" | tr '\n' ' ')"

# 2. Capture CUDA artifacts.
REPO="$W/repo"
# The captures run at once: each is mostly AOTInductor compiling, and a GPU
# machine has the cores for them (one after another took 280 s on an H200 host).
capture() {  # name model calls [frames [repository]]
  log "capturing $1 for $DEVICE"
  local frames=()
  [[ -n "${4:-}" ]] && frames=(--frames "$4")
  "$PYTHON" -m precompile_capture --model "$2" --calls "$3" --name "$1" \
    --out "${5:-$REPO}/$1/1" --device "$DEVICE" "${frames[@]}" > "$OUT/capture_$1.log" 2>&1
}
captures=()
capture mlp examples.models:make_mlp examples/mlp.calls.json & captures+=("mlp:$!")
capture loop examples.models:make_loop examples/loop.calls.json & captures+=("loop:$!")
capture branch examples.models:make_branch examples/branch.calls.json & captures+=("branch:$!")
capture nested examples.models:make_nested examples/nested.calls.json encoder,scale,wobble &
captures+=("nested:$!")
capture medium bench.models:make_medium bench/medium.calls.json & captures+=("medium:$!")
capture bert gallery.models:make_bert gallery/bert.calls.json & captures+=("bert:$!")
capture gpt2 gallery.models:make_gpt2 gallery/gpt2.calls.json & captures+=("gpt2:$!")
capture resnet18 gallery.models:make_resnet18 gallery/resnet18.calls.json & captures+=("resnet18:$!")
capture gpt2_decoder gallery.models:make_gpt2_decoder gallery/gpt2_decoder.calls.json &
captures+=("gpt2_decoder:$!")
capture llama_decoder gallery.models:make_llama_decoder gallery/gpt2_decoder.calls.json &
captures+=("llama_decoder:$!")
# Served by a server of its own, whose device it poisons, beside a model
# whose out-of-range indices the capture fences (they must not poison it).
LOST_REPO="$W/repo_lost"
capture device_lost device_lost_model:make_model tests/device/device_lost.calls.json "" "$LOST_REPO" &
captures+=("device_lost:$!")
capture value_indexed tests.value_indices.value_indexed:make_value_indexed \
  tests/value_indices/value_indexed.calls.json "" "$LOST_REPO" &
captures+=("value_indexed:$!")
capture pooled_embeddings tests.value_indices.pooled_embeddings:make_pooled_embeddings \
  tests/value_indices/pooled_embeddings.calls.json "" "$LOST_REPO" &
captures+=("pooled_embeddings:$!")
CAPTURED=0  # a model that fails to capture is left out, and the check fails
for c in "${captures[@]}"; do
  wait "${c#*:}" || { log "capture of ${c%%:*} failed: $(tail -n 1 "$OUT/capture_${c%%:*}.log")"; CAPTURED=1; }
done

# The decoders served stateful too: the server keeps each sequence's cache,
# on CUDA in device memory.
for m in gpt2_decoder llama_decoder; do
  [[ -d "$REPO/$m/1" ]] || continue
  mkdir -p "$REPO/${m}_stateful"
  cp -r "$REPO/$m/1" "$REPO/${m}_stateful/1"
  cp gallery/decoder_stateful.config.pbtxt "$REPO/${m}_stateful/config.pbtxt"
done
# BERT and resnet18 with dynamic batching as well (bench/batching.sh's config).
for m in bert resnet18; do
  mkdir -p "$REPO/${m}_batched"
  cp -r "$REPO/$m/1" "$REPO/${m}_batched/1"
  printf 'max_batch_size: 64\ndynamic_batching { max_queue_delay_microseconds: %s }\n' \
    "${BATCH_DELAY_US:-1000}" > "$REPO/${m}_batched/config.pbtxt"
done

# 2b. A call that poisons the device: a server of its own serves a model
# that asserts its input's values with torch._assert_async (a device-side
# assert in Inductor's kernel); a call with large values fails it. First,
# the same server's value_indexed, whose indices the capture fences: a call
# past its table must fail alone (INVALID_ARGUMENT) and leave the device
# working; and its pooled_embeddings, whose compiled EmbeddingBag calls
# ATen's kernel through the CUDA shim the server defines (the kernel's input
# check runs on the host first): offsets that go back by 1e8 likewise. On CUDA the poisoned server must then stop calling itself live,
# so that the orchestrator restarts it, and on SIGTERM drain and exit 3.
# (On the CPU the assert fails that call only. The dry run only exercises
# the steps.)
DEVICE_LOST=0
within 150 "the device-lost probe" "$PYTHON" - "$BUNDLE/bin" "$LOST_REPO" "$DEVICE" \
  "$((${PORT:-28501} + 10))" "$OUT" "$W" <<'EOF' || DEVICE_LOST=1
import json, signal, subprocess, sys, time, urllib.error, urllib.request
import numpy as np
import torch
from device_lost_model import make_model

bin_dir, repo, device, port, out, work = sys.argv[1:7]
port = int(port)
server_log = f"{out}/server_device_lost.log"
server = subprocess.Popen(
    [f"{bin_dir}/precompile_server", f"--model_repository={repo}", f"--device={device}",
     "--listen_address=127.0.0.1", f"--grpc_port={port}", f"--metrics_port={port + 1}",
     f"--http_port={port + 2}"], stdout=open(server_log, "w"), stderr=subprocess.STDOUT)


def http_status(path):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port + 2}{path}", timeout=2) as answer:
            return answer.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError as e:
        return f"no answer: {e}"


def infer(x, tag, model="device_lost"):
    inputs = x if isinstance(x, dict) else {"x": x}
    flags = []
    for name, value in inputs.items():
        np.save(f"{work}/lost.{tag}.{name}.npy", value)
        flags += ["--input", f"{name}={work}/lost.{tag}.{name}.npy"]
    start = time.monotonic()
    p = subprocess.run([f"{bin_dir}/precompile_client", f"--address=127.0.0.1:{port}", "--json",
                        "infer", model, *flags, "--output_dir", f"{work}/lost.{tag}.out"],
                       capture_output=True, text=True, timeout=60)
    return {"exit": p.returncode, "seconds": round(time.monotonic() - start, 3),
            "detail": (p.stdout + p.stderr).strip()[-1500:]}


r = {"case": "device_lost", "device": device}
deadline = time.monotonic() + 120
while http_status("/v2/health/ready") != 200 and server.poll() is None and time.monotonic() < deadline:
    time.sleep(0.5)
r["ready_before"] = http_status("/v2/health/ready")
x = torch.randn(8, 4, generator=torch.Generator().manual_seed(1))
with torch.no_grad():
    want = make_model()(x).numpy()
r["in_range"] = infer(x.numpy(), "in_range")
try:
    r["in_range"]["correct"] = bool(np.allclose(np.load(f"{work}/lost.in_range.out/output0.npy"), want))
except OSError:
    r["in_range"]["correct"] = False
r["fenced_out_of_range"] = infer(np.full((8, 4), 1e12, dtype=np.float32), "fenced", "value_indexed")
r["live_after_fenced"] = http_status("/v2/health/live")
r["fenced_ok"] = bool(r["fenced_out_of_range"]["exit"] != 0 and r["live_after_fenced"] == 200
                      and "what its guards do not ensure" in r["fenced_out_of_range"]["detail"])
ids = np.array([4, 8, 15, 16, 23, 42, 0, 1, 2, 3, 49], dtype=np.int64)
r["bag_in_range"] = infer({"ids": ids, "offsets": np.array([0, 2, 6, 9], dtype=np.int64)}, "bag_in",
                          "pooled_embeddings")
r["bag_out_of_range"] = infer({"ids": ids, "offsets": np.array([0, -100000000, 3, 9], dtype=np.int64)},
                              "bag_out", "pooled_embeddings")
r["live_after_bag"] = http_status("/v2/health/live")
r["bag_ok"] = bool(r["bag_in_range"]["exit"] == 0 and r["bag_out_of_range"]["exit"] != 0
                   and "offsets holds -100000000" in r["bag_out_of_range"]["detail"]
                   and r["live_after_bag"] == 200)
r["out_of_range"] = infer(np.full((8, 4), 1e12, dtype=np.float32), "out_of_range")
start = time.monotonic()
for _ in range(60):
    r["live_after"] = http_status("/v2/health/live")
    if r["live_after"] != 200:
        break
    time.sleep(0.25)
r["live_turned_after_s"] = round(time.monotonic() - start, 2)
r["ready_after"] = http_status("/v2/health/ready")
r["in_range_after"] = infer(x.numpy(), "after")
r["server_running_after"] = server.poll() is None
if server.poll() is None:
    start = time.monotonic()
    server.send_signal(signal.SIGTERM)
    try:
        r["exit"] = server.wait(60)
    except subprocess.TimeoutExpired:
        server.kill()
        r["exit"] = "killed: no exit within 60 s of SIGTERM"
    r["exit_after_s"] = round(time.monotonic() - start, 2)
else:
    r["exit"] = server.returncode
logged = [line for line in open(server_log) if "event=device_lost" in line]
r["device_lost_logged"] = logged[0].strip()[-600:] if logged else None
# Drained, it leaves with 3 (the device lost) rather than unloading models
# on a poisoned context, whose destructors throw.
r["ok"] = bool(r["in_range"]["correct"] and r["fenced_ok"] and r["bag_ok"] and r["out_of_range"]["exit"] != 0
               and r["live_after"] != 200 and logged and r["exit"] == 3)
json.dump(r, open(f"{out}/device_lost.json", "w"), indent=1)
for key, value in r.items():
    print(f"gpu_check: device lost: {key}: {value}", file=sys.stderr)
sys.exit(0 if r["ok"] or device != "cuda" else 1)
EOF

# 3. Serve them.
PORT=${PORT:-28501}
CLIENT=("$BUNDLE/bin/precompile_client" --address="127.0.0.1:$PORT")
serve() {  # log_name flags...: a server of the repository in $SERVER, once SERVING
  local log_file="$OUT/$1.log"
  shift
  "$BUNDLE/bin/precompile_server" --model_repository="$REPO" --device="$DEVICE" "$@" \
    --listen_address=127.0.0.1 --grpc_port="$PORT" --metrics_port=$((PORT + 1)) --http_port=$((PORT + 2)) \
    > "$log_file" 2>&1 &
  SERVER=$!
  for _ in $(seq 300); do
    "${CLIENT[@]}" health > /dev/null 2>&1 && return 0
    kill -0 "$SERVER" 2>/dev/null || { log "the server exited: $(tail -5 "$log_file")"; return 1; }
    ((SECONDS < BUDGET_S)) || break
    sleep 1
  done
  log "the server is not SERVING ($log_file)"
  return 1
}
stop_serving() {
  kill -TERM "$SERVER" 2>/dev/null || true
  wait "$SERVER" || true
  SERVER=
}
serve server || exit 1

# 4. Outputs against the CPU: the cases, their inputs and the eager CPU result.
CASES="$W/cases"
mkdir -p "$CASES"
"$PYTHON" - "$CASES" <<'EOF'
import json, sys
import numpy as np
import torch
from examples import models
from bench import models as bench_models
from gallery import models as gallery_models

out = sys.argv[1]
g = torch.Generator().manual_seed(0)
# name, model, factory, input shape, params, expected outcome; the input is x.
cases = [
    ("mlp_b8", "mlp", models.make_mlp, [8, 4], {}, "variant"),
    ("mlp_b16", "mlp", models.make_mlp, [16, 4], {}, "variant"),
    ("mlp_b5", "mlp", models.make_mlp, [5, 4], {}, "variant"),
    ("mlp_b1", "mlp", models.make_mlp, [1, 4], {}, "FAILED_PRECONDITION"),
    ("loop_n0", "loop", models.make_loop, [8, 4], {"n": 0}, "variant"),
    ("loop_n2", "loop", models.make_loop, [8, 4], {"n": 2}, "eager_fallback"),
    ("branch_false", "branch", models.make_branch, [8, 4], {"check": False}, "variant"),
    ("branch_true", "branch", models.make_branch, [8, 4], {"check": True}, "eager_fallback"),
    ("nested_k0", "nested", models.make_nested, [8, 4], {"k": 0}, "variant"),
    ("nested_k1", "nested", models.make_nested, [8, 4], {"k": 1}, "eager_fallback"),
    ("medium", "medium", bench_models.make_medium, [32, 256], {}, "variant"),
]
index = []
for name, model, factory, shape, params, outcome in cases:
    x = torch.randn(shape, generator=g)
    np.save(f"{out}/{name}.x.npy", x.numpy())
    if outcome != "FAILED_PRECONDITION":
        with torch.no_grad():
            y = factory()(x, **params)
        np.save(f"{out}/{name}.expected.npy", y.numpy())
    index.append({"name": name, "model": model, "inputs": {"x": f"{name}.x.npy"},
                  "output": "output0", "params": params, "outcome": outcome})
# Hugging Face models, called with keywords, at shapes they were not captured at.
def keyword_case(name, factory, output, shape):
    ids = torch.randint(0, 1000, shape, generator=g)
    mask = torch.ones(shape, dtype=torch.long)
    np.save(f"{out}/{name}.input_ids.npy", ids.numpy())
    np.save(f"{out}/{name}.attention_mask.npy", mask.numpy())
    with torch.no_grad():
        y = getattr(factory()(input_ids=ids, attention_mask=mask), output)
    np.save(f"{out}/{name}.expected.npy", y.numpy())
    index.append({"name": name, "model": name, "output": output, "params": {},
                  "outcome": "variant",
                  "inputs": {"input_ids": f"{name}.input_ids.npy",
                             "attention_mask": f"{name}.attention_mask.npy"}})
keyword_case("bert", gallery_models.make_bert, "last_hidden_state", (3, 11))
keyword_case("gpt2", gallery_models.make_gpt2, "logits", (3, 29))  # a decoder's logits
# torchvision's resnet18 at batch 3 (captured at 2 and 4). Its convolutions go
# through cuDNN, which libtorch lets use TF32 by default, as eager PyTorch on a
# GPU does: compared with the CPU at a TF32 tolerance, the error is reported.
x = torch.randn(3, 3, 224, 224, generator=g)
np.save(f"{out}/resnet18.x.npy", x.numpy())
with torch.no_grad():
    y = gallery_models.make_resnet18()(x)
np.save(f"{out}/resnet18.expected.npy", y.numpy())
index.append({"name": "resnet18", "model": "resnet18", "output": "output0", "params": {},
              "outcome": "variant", "inputs": {"x": "resnet18.x.npy"}, "tolerance": 2e-2})
with open(f"{out}/cases.json", "w") as f:
    json.dump(index, f)
EOF
if "$PYTHON" - "$CASES" "$OUT" "${CLIENT[@]}" <<'EOF'
import json, subprocess, sys
from concurrent.futures import ThreadPoolExecutor
import numpy as np
cases_dir, out, client = sys.argv[1], sys.argv[2], sys.argv[3:]

def check(case, tag):
    name = case["name"]
    out_dir = f"{cases_dir}/{name}.{tag}.out"
    cmd = client + ["--json", "infer", case["model"], "--output_dir", out_dir]
    for input_name, path in case["inputs"].items():
        cmd += ["--input", f"{input_name}={cases_dir}/{path}"]
    for k, v in case["params"].items():
        cmd += ["--param", f"{k}={json.dumps(v)}"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    text = p.stdout + p.stderr
    r = {"case": name, "pass": tag, "expected_outcome": case["outcome"], "exit": p.returncode}
    if case["outcome"] == "FAILED_PRECONDITION":
        r["ok"] = p.returncode == 1 and "FAILED_PRECONDITION" in text
        r["detail"] = text.strip().splitlines()[-1] if text.strip() else ""
        return r
    try:
        outcome = json.loads(p.stdout).get("outcome", "?")
    except ValueError:
        outcome = "?"
    try:
        got = np.load(f"{out_dir}/{case['output']}.npy")
        want = np.load(f"{cases_dir}/{name}.expected.npy")
        err = float(np.max(np.abs(got - want))) if got.shape == want.shape else float("inf")
        tol = case.get("tolerance", 1e-3)
        close = got.shape == want.shape and np.allclose(got, want, rtol=tol, atol=tol)
    except Exception:  # no output saved: the call failed
        err, close = None, False
        r["detail"] = text.strip()[-300:]
    r.update(outcome=outcome, max_abs_err=err,
             ok=p.returncode == 0 and close and outcome == case["outcome"])
    return r

cases = json.load(open(f"{cases_dir}/cases.json"))
# One after another, then every case four times at once: calls in flight
# together, each on a CUDA stream of its own, must not see each other's work.
results = [check(case, "alone") for case in cases]
with ThreadPoolExecutor(8) as pool:
    results += list(pool.map(lambda job: check(*job),
                             [(case, f"together{i}") for i in range(4) for case in cases]))
for r in results:
    print(f"gpu_check: {r['case']:14s} {r['pass']:10s} {'ok' if r['ok'] else 'FAILED'} "
          f"{r.get('outcome', '')} max|err|={r.get('max_abs_err')}", file=sys.stderr)
json.dump(results, open(f"{out}/correctness.json", "w"), indent=1)
sys.exit(0 if all(r["ok"] for r in results) else 1)
EOF
then CORRECT=$UNIT; else CORRECT=1; fi

# Generation: GPT-2 with its cache sent back and forth, and kept by the
# server (on CUDA in device memory), one precompile_client call a token; the
# tokens must be model.generate()'s on the CPU.
if ! "$PYTHON" - "$CASES" "$OUT" "${CLIENT[@]}" <<'EOF'
import json, subprocess, sys
import numpy as np
import torch
from gallery import models
cases_dir, out, client = sys.argv[1], sys.argv[2], sys.argv[3:]
prompts, tokens = [[17, 4, 99, 250, 3], [5, 6]], 12
width = max(map(len, prompts))
ids = np.asarray([[0] * (width - len(p)) + p for p in prompts], dtype=np.int64)
mask = np.asarray([[0] * (width - len(p)) + [1] * len(p) for p in prompts], dtype=np.int64)
with torch.no_grad():
    want = models.make_gpt2_decoder().generate(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask),
                                               do_sample=False, max_new_tokens=tokens, pad_token_id=0)
want = want[:, width:].tolist()

def step(model, inputs, params, tag):
    d = f"{cases_dir}/gen.{tag}"
    cmd = client + ["--json", "infer", model, "--output_dir", d]
    for name, value in inputs.items():
        np.save(f"{d}.{name}.npy", value)
        cmd += ["--input", f"{name}={d}.{name}.npy"]
    for k, v in params.items():
        cmd += ["--param", f"{k}={json.dumps(v)}"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"{model} step {tag}: {(p.stdout + p.stderr).strip()[-300:]}")
    return d

def generate(model, stateful):
    cur_ids, cur_mask, cache, out = ids, mask, {}, [[] for _ in prompts]
    for i in range(tokens):
        positions = np.cumsum(cur_mask, axis=1) - 1
        positions[cur_mask == 0] = 1
        inputs = {"input_ids": cur_ids, "attention_mask": cur_mask,
                  "position_ids": positions[:, -cur_ids.shape[1]:]}
        params = {}
        if stateful:
            params = {"sequence_id": 4242, "sequence_start": i == 0, "sequence_end": i == tokens - 1}
        else:
            inputs.update(cache)
        d = step(model, inputs, params, f"{model}.{i}")
        chosen = np.argmax(np.load(f"{d}/logits.npy")[:, -1], axis=-1).astype(np.int64)
        for row, t in zip(out, chosen):
            row.append(int(t))
        if not stateful:
            cache = {n: np.load(f"{d}/{n}.npy") for n in
                     [f"past_key_values.{kind}_cache.{layer}" for kind in ("key", "value") for layer in (0, 1)]}
        cur_ids = chosen[:, None]
        cur_mask = np.concatenate([cur_mask, np.ones((len(prompts), 1), dtype=np.int64)], axis=1)
    return out

results = []
for model, stateful in (("gpt2_decoder", False), ("gpt2_decoder_stateful", True)):
    try:
        got, detail = generate(model, stateful), ""
    except RuntimeError as e:
        got, detail = None, str(e)
    results.append({"case": f"generate_{model}", "pass": "alone", "ok": got == want,
                    "tokens": got, "expected": want, "detail": detail})
    print(f"gpu_check: generate {model:22s} {'ok' if got == want else 'FAILED'} {detail}", file=sys.stderr)
json.dump(results, open(f"{out}/generation.json", "w"), indent=1)
sys.exit(0 if all(r["ok"] for r in results) else 1)
EOF
then CORRECT=1; fi
((DEVICE_LOST == 0 && CAPTURED == 0)) || CORRECT=1

# 5. Load, and the in-process limit.
mix() {
  printf '[{"name": "%s", "model": "%s", "inputs": {"x": {"shape": %s, "datatype": "FP32", "fill": "random"}}}]\n' \
    "$1" "$1" "$2" > "$W/mix_$1.json"
}
mix mlp "[8, 4]"
mix medium "[32, 256]"
mix resnet18 "[3, 3, 224, 224]"
printf '[{"name": "bert", "model": "bert", "inputs": {"input_ids": {"npy": "%s"}, "attention_mask": {"npy": "%s"}}}]\n' \
  "$CASES/bert.input_ids.npy" "$CASES/bert.attention_mask.npy" > "$W/mix_bert.json"
# Sequences of a prompt of 6 and 31 tokens after it, the cache kept by the
# server: requests per second are tokens per second.
cat > "$W/mix_gpt2_decoder_stateful.json" <<'EOF'
[{"name": "generate", "model": "gpt2_decoder_stateful",
  "inputs": {"input_ids": {"shape": [1, 6], "datatype": "INT64", "fill": "zeros"},
             "position_ids": {"shape": [1, 6], "datatype": "INT64", "fill": "zeros"},
             "attention_mask": {"shape": [1, 6], "datatype": "INT64", "fill": "ones"}},
  "sequence": {"requests": 32,
               "next_inputs": {"input_ids": {"shape": [1, 1], "datatype": "INT64", "fill": "zeros"},
                               "position_ids": {"shape": [1, 1], "datatype": "INT64", "fill": "zeros"}},
               "grow": {"attention_mask": 1}}}]
EOF
for m in bert resnet18; do
  sed "s/\"model\": \"$m\"/\"model\": \"${m}_batched\"/" "$W/mix_$m.json" > "$W/mix_${m}_batched.json"
done
load() {  # mix results_name [concurrency]
  local concurrency=${3:-1,8,64}
  log "load: $2 at concurrency $concurrency"
  within 40 "load of $2" "$BUNDLE/bin/precompile_load" --address="127.0.0.1:$PORT" \
    --mix="$W/mix_$1.json" --concurrency="$concurrency" --warmup=1 --duration=4 --quiet \
    --json_out="$OUT/load_$2.json" > "$OUT/load_$2.txt" || true
}
for m in mlp medium bert bert_batched resnet18 resnet18_batched gpt2_decoder_stateful; do
  load "$m" "$m"
done
# The in-process limit, while the server idles (what the budget leaves for
# the steps after this may cut them short).
rm -f "$OUT/direct.jsonl"
direct() {  # label threads args...: the in-process limit
  local label=$1 threads=$2
  shift 2
  within 40 "in process $label" "$BUNDLE/bin/aoti_direct_bench" --device="$DEVICE" "$@" \
    --threads="$threads" --warmup=0.5 --duration=2 --label="${label}_$DEVICE" \
    --json_out="$OUT/direct.jsonl" >> "$OUT/direct.txt" 2>&1 ||
    log "aoti_direct_bench $label failed (see direct.txt)"
}
direct loader_medium 1,8,64 --mode=loader --package="$REPO/medium/1/frames/forward/0.pt2" --shape=32,256
direct model_medium 1,8,64 --mode=model --artifact="$REPO/medium/1" --shape=32,256
# BERT and resnet18 as the load above sends them (3 rows), and at 48 rows
# (what batching makes of 16 such requests).
for rows in 3 48; do
  threads=1,8,64
  ((rows == 3)) || threads=1,8
  direct "model_bert_${rows}x11" "$threads" --mode=model --artifact="$REPO/bert/1" \
    --inputs="input_ids:int64:${rows}x11;attention_mask:int64:${rows}x11"
  direct "model_resnet18_${rows}" "$threads" --mode=model --artifact="$REPO/resnet18/1" \
    --shape="$rows,3,224,224"
done
# Generation three ways (the cache kept by the server, sent back and forth,
# the prefix recomputed), per token and at 1, 8, 64 sequences (bench/generation.py).
GEN_PYTHONPATH=$PYTHONPATH
if ! "$PYTHON" -c 'import tritonclient.grpc' 2> /dev/null; then
  "$PYTHON" -m pip install -q --no-index --no-deps --target "$W/site" "$BUNDLE"/wheels/*.whl ||
    log "cannot install the carried python-rapidjson"
  GEN_PYTHONPATH="$W/site:$BUNDLE/protobuf:$GEN_PYTHONPATH"
fi
log "generation bench"
PYTHONPATH=$GEN_PYTHONPATH within 150 "generation bench" "$PYTHON" bench/generation.py \
  "127.0.0.1:$PORT" "$OUT/generation_bench.json" client/python \
  > "$OUT/generation_bench.txt" 2> "$OUT/generation_bench.log" ||
  log "generation bench failed or ran out of time: $(tail -3 "$OUT/generation_bench.log")"
curl -s "http://127.0.0.1:$((PORT + 1))/metrics" > "$OUT/metrics.txt" 2>/dev/null || true
stop_serving
# The same loads at 8 and 64 clients against other settings, side by side on
# one machine: copies from and to pageable memory rather than through pinned
# buffers; and the large requests with the front relaying on one thread, as
# before it had several. (Streams per call against the default stream,
# --cuda_stream_per_call=false, were measured so on an H100:
# bench/RESULTS.md section 5, fourth run.)
if serve server_pageable --cuda_pinned_staging=false; then
  for m in medium bert resnet18; do
    load "$m" "${m}_pageable" 8,64
  done
fi
stop_serving
if serve server_one_relay_thread --grpc_relay_threads=1; then
  for m in bert_batched resnet18 resnet18_batched; do
    load "$m" "${m}_one_relay_thread" 8,64
  done
fi
stop_serving

within 40 "front relay bench" "$BUNDLE/bin/front_relay_bench" --seconds=2 --connections=16 \
  --relay_threads=1,4 --tls > "$OUT/front_relay.txt" 2>&1 || log "front_relay_bench failed (see front_relay.txt)"

# 6. Summary.
"$PYTHON" - "$OUT" "$CORRECT" <<'EOF'
import glob, json, os, re, sys
out, correct = sys.argv[1], sys.argv[2] == "0"
correctness = json.load(open(f"{out}/correctness.json"))
if os.path.exists(f"{out}/generation.json"):
    correctness += json.load(open(f"{out}/generation.json"))
if os.path.exists(f"{out}/device_lost.json"):
    correctness.append(json.load(open(f"{out}/device_lost.json")))
summary = {"correct": correct, "correctness": correctness,
           "load": {}, "direct": []}
if os.path.exists(f"{out}/generation_bench.json"):
    summary["generation_bench"] = json.load(open(f"{out}/generation_bench.json"))
for p in sorted(glob.glob(f"{out}/load_*.json")):
    m = os.path.basename(p)[len("load_"):-len(".json")]
    summary["load"][m] = [
        {"concurrency": ph["concurrency"], "rps": ph["throughput_rps"],
         "p50_ms": ph["latency_ms"]["p50"], "p99_ms": ph["latency_ms"]["p99"],
         "errors": ph["errors"], "outcomes": ph["outcomes"]}
        for ph in json.load(open(p))["phases"]]
if os.path.exists(f"{out}/metrics.txt"):  # rows per execution of the batched models
    metrics = open(f"{out}/metrics.txt").read()
    for m in ("bert_batched", "resnet18_batched"):
        total = {k: sum(float(v) for v in re.findall(
                     rf'^precompile_batch_rows_{k}{{[^}}]*model="{m}"[^}}]*}} (\S+)$', metrics, re.M))
                 for k in ("sum", "count")}
        if total["count"]:
            summary.setdefault("rows_per_execution", {})[m] = total["sum"] / total["count"]
if os.path.exists(f"{out}/direct.jsonl"):
    summary["direct"] = [json.loads(l) for l in open(f"{out}/direct.jsonl")]
if os.path.exists(f"{out}/front_relay.txt"):
    summary["front_relay_gb_per_s"] = [
        dict(zip(("direction", "connections", "route", "gb_per_s"), l.split()))
        for l in open(f"{out}/front_relay.txt").read().splitlines()[1:] if len(l.split()) == 4]
if os.path.exists(f"{out}/cuda_unit_tests.txt"):
    summary["unit_tests"] = [l.strip() for l in open(f"{out}/cuda_unit_tests.txt")
                             if l.startswith(("[       OK", "[  FAILED", "[  SKIPPED"))]
json.dump(summary, open(f"{out}/gpu_summary.json", "w"), indent=1)
print("gpu_check: outputs vs CPU (alone, then four at once):", "all ok" if correct else "FAILURES",
      f"({sum(r['ok'] for r in summary['correctness'])}/{len(summary['correctness'])})")
for m, phases in summary["load"].items():
    for ph in phases:
        print(f"gpu_check: served {m:24s} c={ph['concurrency']:<3d} {ph['rps']:9.0f} req/s  "
              f"p50 {ph['p50_ms']:.3f} ms  p99 {ph['p99_ms']:.3f} ms  errors {ph['errors']}")
if os.path.exists(f"{out}/generation_bench.txt"):
    for line in open(f"{out}/generation_bench.txt"):
        print("gpu_check: generation", line.rstrip())
for m, rows in summary.get("rows_per_execution", {}).items():
    print(f"gpu_check: {m} ran {rows:.1f} rows per execution")
for r in summary.get("front_relay_gb_per_s", []):
    print(f"gpu_check: relay {r['direction']:4s} {r['connections']:>2s} connections "
          f"{r['route']:8s} {r['gb_per_s']} GB/s")
for d in summary["direct"]:
    print(f"gpu_check: in process {d['label']:20s} t={d['threads']:<3d} "
          f"{d['throughput_cps']:9.0f} calls/s  p50 {d['p50_us']:.1f} us")
EOF
log "wrote $FINAL/gpu_summary.json and $FINAL/gpu_check_results.tar.gz"
exit "$CORRECT"
