#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz/ with clang (ASan + UBSan) and
# runs each for a bounded time, starting from its committed seed corpus.
#
#   tests/fuzz/run_fuzzers.sh [seconds_per_fuzzer]    (default 20)
#
# Needs clang and libFuzzer (Debian: clang libclang-rt-14-dev; llvm-14 for
# symbolized reports) and the generated C++ protos, which it builds with
# Bazel. Builds into .fuzz/ (gitignored; compiled objects are cached for every
# clone in ~/.cache/precompile-serve/fuzz); new inputs the fuzzers find go to a
# temporary directory, so the committed corpus never grows by itself.
#
# Prints one line per fuzzer with its executions, then
# "fuzz: N passed, N failed". Exits 1 if any fuzzer failed; a crash's input
# is kept under .fuzz/crashes/. To turn it into a regression test:
#   .fuzz/bin/<fuzzer> -minimize_crash=1 -runs=20000 \
#       -exact_artifact_path=tests/fuzz/regressions/<fuzzer>/<name> <crash file>
# then fix the bug; //tests/fuzz:fuzz_regression_test replays that file.
#
# Environment: FUZZERS (the targets to run, default all), FUZZ_CXX (default
# clang++), FUZZ_JOBS (fuzzers run at once, default nproc; compiles always use
# every core), FUZZ_GEN (a bazel-bin that already holds the generated protos:
# no Bazel command is run, so another may be running), FUZZ_BUILD_ONLY=1
# (build the fuzzers, run none), FUZZ_SKIP_BUILD=1 (run those .fuzz/bin
# holds, just built from this checkout with FUZZ_BUILD_ONLY).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1

seconds=${1:-20}
if ! [[ $seconds =~ ^[1-9][0-9]*$ ]]; then
  echo "usage: $0 [seconds_per_fuzzer]" >&2
  exit 2
fi
fuzzers=(${FUZZERS:-request_decoding_fuzzer guard_fuzzer manifest_fuzzer http_request_fuzzer
          http2_ledger_fuzzer})
say() { echo "[fuzz] $*"; }
give_up() {
  say "$*"
  echo "fuzz: 0 passed, ${#fuzzers[@]} failed"
  exit 1
}

build=.fuzz
if [[ ${FUZZ_SKIP_BUILD:-} == 1 ]]; then
  for f in "${fuzzers[@]}"; do
    [[ -x $build/bin/$f ]] || give_up "FUZZ_SKIP_BUILD=1, but $build/bin/$f is not built"
  done
  mkdir -p "$build/crashes"
else
  cxx=${FUZZ_CXX:-clang++}
  command -v "$cxx" >/dev/null || give_up "$cxx not found (Debian: apt-get install clang libclang-rt-14-dev)"
  echo 'extern "C" int LLVMFuzzerTestOneInput(const char*, unsigned long) { return 0; }' |
    "$cxx" -x c++ -fsanitize=fuzzer - -o /dev/null 2>/dev/null ||
    give_up "$cxx cannot link -fsanitize=fuzzer (Debian: apt-get install libclang-rt-14-dev)"

  if [[ -n ${FUZZ_GEN:-} ]]; then
    gen=$FUZZ_GEN
  else
    say "building the generated protos (bazel build //proto:...)"
    bazel build --noshow_progress //proto:artifact_cc_proto //proto:inference_cc_proto \
      //proto:model_config_cc_proto || give_up "bazel build of the protos failed"
    # Not the bazel-bin symlink: it follows whichever configuration built last.
    gen=$(bazel info bazel-bin 2>/dev/null) || give_up "bazel info bazel-bin failed"
  fi
  [[ -f $gen/proto/inference.pb.cc ]] || give_up "no generated protos in $gen"
  mkdir -p "$build/obj" "$build/bin" "$build/crashes"
  # The generated protos by a path inside the checkout, so that what the
  # compiler sees (and the object cache's key) is the same in every clone.
  ln -sfn "$gen" "$build/gen"

  pkgs=(grpc++ protobuf absl_strings absl_str_format absl_status absl_statusor
        absl_flat_hash_map absl_synchronization)
  read -ra pkg_cflags <<<"$(pkg-config --cflags "${pkgs[@]}")"
  read -ra pkg_libs <<<"$(pkg-config --libs "${pkgs[@]}")"
  # Line tables only (-g1): all a report needs, and cheaper to compile.
  # shellcheck disable=SC2054  # the commas are -fsanitize's
  cxxflags=(-std=c++20 -g1 -O1 -fno-omit-frame-pointer
            -fsanitize=address,undefined -fno-sanitize-recover=all
            -I. -I"$build/gen" "${pkg_cflags[@]}")
  sources=(
    server/api/tensor_codec.cc server/grpc/infer_response.cc server/grpc/http2_stream_ledger.cc
    server/http/http_codec.cc server/http/http_head.cc server/http/http_routes.cc
    base/json_text.cc base/half_float.cc base/log_text.cc
    runtime/guard_program.cc runtime/size_program.cc runtime/frame_dispatcher.cc
    runtime/artifact_reader.cc runtime/dtype.cc runtime/value.cc
    tests/fuzz/fuzz_checks.cc
    "$build/gen/proto/artifact.pb.cc" "$build/gen/proto/inference.pb.cc"
    "$build/gen/proto/model_config.pb.cc"
  )

  export FUZZ_CXX_CMD="$cxx ${cxxflags[*]} -fsanitize=fuzzer-no-link"
  # The generated protos without UBSan: protoc's code is not ours to fix, and
  # UBSan doubled its compile time (inference.pb.cc: 38 s instead of 19).
  export FUZZ_PROTO_CXX_CMD="${FUZZ_CXX_CMD/-fsanitize=address,undefined/-fsanitize=address}"
  export FUZZ_OBJ="$build/obj"
  # Objects are kept by what the compiler sees (the command and the
  # preprocessed source), shared by every clone on this machine; those unused
  # for two weeks go.
  export FUZZ_CACHE=${FUZZ_CACHE:-$HOME/.cache/precompile-serve/fuzz}
  mkdir -p "$FUZZ_CACHE"
  find "$FUZZ_CACHE" -name '*.o' -mtime +14 -delete

  # Compiles $1 into $FUZZ_OBJ, or takes the object from the cache; prints the
  # object's path.
  compile_one() {
    local src=$1 rel=${1#.fuzz/gen/} key
    local obj="$FUZZ_OBJ/${rel//\//_}.o" cmd=$FUZZ_CXX_CMD
    [[ $src == .fuzz/gen/* ]] && cmd=$FUZZ_PROTO_CXX_CMD
    # shellcheck disable=SC2086  # the command is words
    key=$({ echo "$cmd"; $cmd -E -P "$src"; } | sha256sum | cut -c1-40) ||
      return 1
    local cached="$FUZZ_CACHE/$key.o"
    if [[ ! -f $cached ]]; then
      # shellcheck disable=SC2086
      $cmd -c "$src" -o "$obj.tmp" >&2 || return 1
      mv "$obj.tmp" "$cached.$$" && mv "$cached.$$" "$cached"
    fi
    touch "$cached"
    cp "$cached" "$obj"
    echo "$obj"
  }
  export -f compile_one
  say "compiling with $cxx -fsanitize=fuzzer,address,undefined into $build/"
  start=$SECONDS
  # shellcheck disable=SC2016  # $1 is expanded by the inner bash
  printf '%s\n' "${sources[@]}" "${fuzzers[@]/#/tests/fuzz/}" | sed 's/_fuzzer$/&.cc/' |
    xargs -P "$(nproc)" -I{} bash -c 'compile_one "$1"' _ {} >"$build/objects" ||
    give_up "compilation failed"
  mapfile -t objects < <(grep -v '_fuzzer\.cc\.o$' "$build/objects")
  for f in "${fuzzers[@]}"; do
    if ! "$cxx" -fsanitize=fuzzer,address,undefined "$build/obj/tests_fuzz_$f.cc.o" "${objects[@]}" \
        "${pkg_libs[@]}" -lcrypto -o "$build/bin/$f"; then
      give_up "linking $f failed"
    fi
  done
  say "built ${#fuzzers[@]} fuzzers in $((SECONDS - start)) s"
  [[ ${FUZZ_BUILD_ONLY:-} == 1 ]] && exit 0
fi

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
scratch=$(mktemp -d "${TMPDIR:-/tmp}/fuzz.XXXXXX")
trap 'rm -rf "$scratch"' EXIT

# Runs fuzzer $1 for $seconds; prints what it found, and exits non-zero if it
# failed.
fuzz_one() {
  local f=$1 log="$build/$1.log" rc
  mkdir -p "$scratch/$f"
  local dict=()
  [[ -f tests/fuzz/$f.dict ]] && dict=(-dict="tests/fuzz/$f.dict")
  # The first directory receives new inputs; the committed seeds and saved
  # crashes are only read (a saved crash that is not fixed fails at once).
  local inputs=("tests/fuzz/corpus/$f")
  [[ -d tests/fuzz/regressions/$f ]] && inputs+=("tests/fuzz/regressions/$f")
  TMPDIR="$scratch" timeout $((seconds + 120)) "$build/bin/$f" \
    -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$build/crashes/$f-" "${dict[@]}" \
    "$scratch/$f" "${inputs[@]}" >"$log" 2>&1
  rc=$?
  local execs cov units
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1)
  units=$(find "$scratch/$f" -type f | wc -l)
  if ((rc == 0)); then
    say "$f: passed, ${execs:-?} execs in $seconds s, ${cov:-cov: ?}, $units new inputs"
    return 0
  fi
  local crash saved
  crash=$(grep -o "Test unit written to .*" "$log" | tail -1 | sed 's/^Test unit written to //')
  say "$f: FAILED (exit $rc) after ${execs:-?} execs, crash input: ${crash:-none written}, log: $log"
  for saved in tests/fuzz/regressions/"$f"/*; do
    [[ -n $crash && -f $saved ]] && cmp -s "$crash" "$saved" &&
      say "    that is the saved regression $saved: its bug is not fixed yet"
  done
  grep -E "^(==[0-9]+==ERROR|SUMMARY|.*runtime error|$f: )" "$log" | head -5 | sed 's/^/    /'
  return 1
}

# One fuzzer per core at a time: each is single-threaded.
jobs=${FUZZ_JOBS:-$(nproc)}
declare -A running=()
passed=0
failed=0
reap() {  # waits for one fuzzer to end and counts it
  local done_pid
  wait -n -p done_pid "${!running[@]}" && ((++passed)) || ((++failed))
  unset "running[$done_pid]"
}
for f in "${fuzzers[@]}"; do
  ((${#running[@]} < jobs)) || reap
  fuzz_one "$f" &
  running[$!]=$f
done
while ((${#running[@]})); do reap; done
echo "fuzz: $passed passed, $failed failed"
((failed == 0))
