#!/usr/bin/env bash
# Installs everything precompile-serve needs on a fresh Debian 12 machine and
# is safe to run again: Debian's packages (Bazel, gRPC, protobuf, abseil,
# spdlog, GoogleTest, Google Benchmark, prometheus-cpp, nlohmann-json, CLI11,
# cpp-httplib), the project's Python virtual environment (.venv, exact
# versions from requirements.lock), promtool, and the generated Python protos
# the capture tool imports.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

say() { printf '\033[1m[setup]\033[0m %s\n' "$*"; }

debian_packages=(
  bazel-bootstrap g++ pkg-config
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler grpc-proto
  libabsl-dev libspdlog-dev libfmt-dev libssl-dev
  libgtest-dev libgmock-dev libbenchmark-dev prometheus-cpp-dev
  nlohmann-json3-dev libcli11-dev libcpp-httplib-dev
  python3-venv python3-dev curl patchelf openssl clang lld libclang-rt-14-dev llvm-14
  libtcmalloc-minimal4 gdb
)

sudo_cmd=()
[[ $(id -u) -eq 0 ]] || sudo_cmd=(sudo)
missing=()
for p in "${debian_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  say "installing Debian packages: ${missing[*]}"
  "${sudo_cmd[@]}" apt-get update -q
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
else
  say "Debian packages: all present"
fi

python=${PYTHON:-python3}
uv_version=0.13.9
if [[ ! -x .venv/bin/python3 ]]; then
  say "creating the virtual environment .venv with $($python --version)"
  "$python" -m venv .venv
fi
stamp=.venv/.requirements.lock.sha256
want=$(sha256sum requirements.lock | cut -d' ' -f1)
if [[ ! -f $stamp || $(cat "$stamp") != "$want" ]]; then
  say "installing Python packages from requirements.lock into .venv"
  say "torch 2.11.0 is a CUDA build of several GB: the first download can take 2 to 10 minutes"
  # uv (from PyPI, like everything here) keeps unpacked wheels in its cache
  # (~/.cache/uv) and links them into an environment: a second environment
  # takes seconds where pip unpacks the GBs of torch again for minutes.
  # Bytecode is compiled now, as pip does: captures run with
  # PYTHONDONTWRITEBYTECODE, and the embedded interpreter under
  # ThreadSanitizer took minutes compiling torch's modules.
  .venv/bin/python3 -m pip install -q --disable-pip-version-check "uv==$uv_version"
  .venv/bin/uv pip install -q --compile-bytecode --python .venv/bin/python3 -r requirements.lock
  echo "$want" > "$stamp"
else
  say "Python packages: up to date"
fi

# KServe's Python SDK, for its generated API models only: the deploy tests
# check deploy/kserve against them. Without its dependencies (a model
# server's): nothing imports the SDK's package itself.
kserve_version=0.21.0
if [[ ! -d .venv/kserve-sdk/kserve-$kserve_version.dist-info ]]; then
  say "installing KServe's SDK $kserve_version (its API models) into .venv/kserve-sdk"
  rm -rf .venv/kserve-sdk
  .venv/bin/uv pip install -q --no-deps --python .venv/bin/python3 --target .venv/kserve-sdk \
    "kserve==$kserve_version"
fi

# promtool checks and unit-tests the alerting rules (deploy/monitoring). It
# is unpacked from Debian's prometheus package rather than installed: the
# package would start a Prometheus server on every address of the machine.
promtool_dir=$HOME/.cache/precompile-serve/promtool
if [[ ! -x $promtool_dir/promtool ]]; then
  say "unpacking promtool from Debian's prometheus package into $promtool_dir"
  scratch=$(mktemp -d)
  if ! (cd "$scratch" && apt-get download -q prometheus >/dev/null 2>&1); then
    "${sudo_cmd[@]}" apt-get update -q
    (cd "$scratch" && apt-get download -q prometheus)
  fi
  dpkg-deb -x "$scratch"/prometheus_*.deb "$scratch/unpacked"
  mkdir -p "$promtool_dir"
  cp "$scratch/unpacked/usr/bin/promtool" "$promtool_dir/promtool"
  rm -rf "$scratch"
fi
ln -sfn "$promtool_dir/promtool" .venv/bin/promtool

# Bazel's disk cache (.bazelrc) grows with every change built: past 20 GiB,
# the files read longest ago go until 15 GiB are left.
disk_cache=$HOME/.cache/precompile-serve/bazel
if [[ -d $disk_cache ]] && (($(du -sk "$disk_cache" | cut -f1) > 20 * 1024 * 1024)); then
  say "pruning Bazel's disk cache $disk_cache to 15 GiB"
  find "$disk_cache" -type f -printf '%A@ %s %p\n' | sort -n |
    awk -v excess=$(($(du -sb "$disk_cache" | cut -f1) - 15 * 1024 * 1024 * 1024)) \
      '{ if (freed < excess) { print $3; freed += $2 } }' | xargs -r rm -f
fi

say "generating the Python protos (bazel build //proto:python)"
bazel build --noshow_progress //proto:python
bin=$(bazel info bazel-bin 2>/dev/null)
site=$(.venv/bin/python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
# The capture tool and the generated protos, importable from the environment.
printf '%s\n%s\n' "$root/capture" "$bin" > "$site/precompile_serve.pth"
say "ready: .venv has torch $(.venv/bin/python3 -c 'import torch; print(torch.__version__)' 2>/dev/null)"
