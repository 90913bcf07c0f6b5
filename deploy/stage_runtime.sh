#!/usr/bin/env bash
# Lays out what the runtime image needs from a build of precompile_server
# (deploy/Dockerfile runs it in the builder stage; deploy/tests runs it too):
#
#   DEST/bin/precompile_server          run path $ORIGIN/../torch/lib
#   DEST/torch/lib/libtorch.so          the CPU-only stand-in (bazel/torch.bzl)
#   DEST/torch/lib/libtorch_cpu.so ...  the libraries of the torch wheel that
#   DEST/nvidia/<pkg>/lib/...           the server loads, wheel layout kept
#
# The wheel's libraries find each other through their own run paths
# ($ORIGIN and $ORIGIN/../../nvidia/<pkg>/lib), so keeping the wheel's layout
# under DEST keeps them working. The server and the stand-in are linked with
# absolute run paths into the build tree (.venv, Bazel's output base); they
# are rewritten relative to $ORIGIN (patchelf), so the image needs no
# LD_LIBRARY_PATH and no path of the build machine.
#
# Parts:
#   --part=cpu   the server and everything it loads (every image)
#   --part=cuda  what CUDA artifacts add: libtorch_cuda, which the runtime
#                loads on demand from libtorch_cpu's directory
#                (runtime/cuda_support.cc), its companions, and every CUDA
#                library of the wheel (nvidia/*/lib), less what --part=cpu has
#
# Libraries from Debian (gRPC, protobuf, abseil, ...) are not copied: the image
# installs their packages. A library found anywhere else is an error.
#
# Usage: deploy/stage_runtime.sh --part=cpu|cuda [--binary=PATH] [--dry-run] DEST
#   --binary   the server binary (default bazel-bin/server/precompile_server)
#   --dry-run  print "source -> destination" lines, copy nothing
set -euo pipefail

part=""
binary=bazel-bin/server/precompile_server
dry_run=0
dest=""
for arg in "$@"; do
  case "$arg" in
    --part=*) part=${arg#--part=} ;;
    --binary=*) binary=${arg#--binary=} ;;
    --dry-run) dry_run=1 ;;
    -*) echo "stage_runtime: unknown option $arg" >&2; exit 2 ;;
    *) dest=$arg ;;
  esac
done
if [[ $part != cpu && $part != cuda ]] || [[ -z $dest ]]; then
  echo "usage: $0 --part=cpu|cuda [--binary=PATH] [--dry-run] DEST" >&2
  exit 2
fi
[[ -x $binary ]] || { echo "stage_runtime: no server binary at $binary" >&2; exit 1; }

# What the dynamic loader resolves for the binary, as it was built.
declare -A resolved=()
while read -r name arrow path _; do
  [[ $arrow == "=>" ]] || continue
  if [[ $path == "not" ]]; then
    echo "stage_runtime: $binary: $name is not found (run tools/setup.sh)" >&2
    exit 1
  fi
  resolved[$name]=$(readlink -f "$path")
done < <(ldd "$binary")

torch_cpu=${resolved[libtorch_cpu.so]:-}
[[ -n $torch_cpu ]] || { echo "stage_runtime: $binary does not load libtorch_cpu.so" >&2; exit 1; }
torch_lib=$(dirname "$torch_cpu")        # <site-packages>/torch/lib
site=$(dirname "$(dirname "$torch_lib")")  # <site-packages>

# source -> path under DEST
declare -A plan=()
add() { plan[$1]=$2; }

# The wheel's path for a library, or "" if it is not the wheel's.
wheel_path() {
  case "$1" in
    "$site"/torch/lib/*) echo "torch/lib/${1#"$site"/torch/lib/}" ;;
    "$site"/nvidia/*/lib/*) echo "nvidia/${1#"$site"/nvidia/}" ;;
    *) echo "" ;;
  esac
}

if [[ $part == cpu ]]; then
  add "$(readlink -f "$binary")" bin/precompile_server
  for name in "${!resolved[@]}"; do
    path=${resolved[$name]}
    case "$path" in
      /lib/* | /usr/lib/* | /lib64/*) continue ;;  # Debian's: installed by apt in the image
    esac
    if [[ $name == libtorch.so ]]; then
      # The CPU-only stand-in, built into Bazel's torch repository.
      [[ $(wheel_path "$path") == "" ]] || {
        echo "stage_runtime: $binary loads the wheel's libtorch.so ($path), not the CPU-only stand-in" >&2
        exit 1
      }
      add "$path" torch/lib/libtorch.so
      continue
    fi
    to=$(wheel_path "$path")
    [[ -n $to ]] || { echo "stage_runtime: $name comes from $path, outside the torch wheel and Debian" >&2; exit 1; }
    add "$path" "$to"
  done
else
  # Loaded by path from libtorch_cpu's directory, and what it loads lazily.
  for name in libtorch_cuda.so libc10_cuda.so libtorch_nvshmem.so libtorch_cuda_linalg.so libcaffe2_nvrtc.so; do
    [[ -f $torch_lib/$name ]] || { echo "stage_runtime: the torch wheel has no $name: not a CUDA build?" >&2; exit 1; }
    add "$torch_lib/$name" "torch/lib/$name"
  done
  # Every CUDA library of the wheel: cuDNN, cuBLAS and others open parts of
  # themselves with dlopen, which no list of NEEDED entries shows.
  declare -A in_cpu=()
  for name in "${!resolved[@]}"; do in_cpu[${resolved[$name]}]=1; done
  while IFS= read -r -d '' path; do
    path=$(readlink -f "$path")
    [[ -z ${in_cpu[$path]:-} ]] || continue
    add "$path" "$(wheel_path "$path")"
  done < <(find "$site"/nvidia/*/lib -maxdepth 1 -type f -name '*.so*' -print0)
fi

if ((dry_run)); then
  for from in "${!plan[@]}"; do echo "$from -> ${plan[$from]}"; done | sort -k3
  exit 0
fi

for from in "${!plan[@]}"; do
  to=$dest/${plan[$from]}
  mkdir -p "$(dirname "$to")"
  cp -f "$from" "$to"
  chmod 0755 "$to"
done

if [[ $part == cpu ]]; then
  patchelf --version >/dev/null 2>&1 || { echo "stage_runtime: patchelf is missing (tools/setup.sh installs it)" >&2; exit 1; }
  patchelf --set-rpath '$ORIGIN/../torch/lib' "$dest/bin/precompile_server"
  patchelf --set-rpath '$ORIGIN' "$dest/torch/lib/libtorch.so"
fi
echo "stage_runtime: staged ${#plan[@]} files (--part=$part) in $dest"
