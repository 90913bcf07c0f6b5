#!/usr/bin/env bash
# Sets up the machine (tools/setup.sh), builds everything and runs every test,
# each test target once, in the strictest configuration that can run it:
#   1. plain: the gallery (Hugging Face and torchvision models through the
#      real server), the deployment images and manifests, the capture rules;
#      and the binaries and artifacts pytest uses
#   2. AddressSanitizer (with leak checking): the base's, runtime's,
#      server's and client's unit tests, the end-to-end and process tests, fuzz
#      regressions; ThreadSanitizer: those that exercise threads
#   3. the libFuzzer fuzzers (request decoding, guards, manifests, HTTP
#      requests), each for a bounded time, beside
#   4. pytest: the capture tool, the Python client example, the HTTP/REST
#      endpoint with Triton's client and curl, hostile clients (sizes near
#      2^64, loops without end, names without end), the recapture loop (misses
#      exported, recaptured and hot-swapped under load), Python eager
#      programs served by the embedded interpreter, and the README's serving
#      commands as written
# Each stage ends with its own summary line ("bazel: N passed, N failed, ..."),
# and the last line says how long each stage took.
set -uo pipefail
cd "$(dirname "$0")/.."

tools/setup.sh || exit 1
setup_seconds=$SECONDS
failed=0

# Each bazel test run writes its build events here; the summary counts only
# what that run reports (a target that failed to build is a failure, not the
# test.xml an earlier run left behind).
events=$(mktemp -d)
trap 'rm -rf "$events"' EXIT

# Prints "<label>: N passed, N failed, N skipped" for the tests Bazel ran.
summarize() {
  local label=$1 config=$2
  shift 2
  local testlogs
  testlogs=$(bazel info $config bazel-testlogs 2>/dev/null)
  .venv/bin/python3 tools/test_summary.py --label "$label" --bep "$events/$label.json" \
    "$testlogs" "$@" || failed=1
}

# A sanitizer test still running near its timeout writes every
# thread's stack to its log (a rare hang says where it waits).
stacks_on_hang=(--run_under=//tests/testing:stacks_on_hang)

# Each target's tests run once, in the strictest configuration that can run
# them: the shared base's, the runtime's, the server's, the client's and the
# end-to-end tests under AddressSanitizer (and the threaded ones under
# ThreadSanitizer too);
# the rest (gallery, deployment, capture rules, benchmarks' inputs) plain.
sanitized=(//base/... //runtime/... //server/... //client/... //tests/...)
# What pytest runs, from bazel-bin: the plain build (one list, which the
# Python tests name when something is missing).
mapfile -t for_pytest < tests/testing/pytest_targets.txt
stage_times=()
timed() {  # timed LABEL COMMAND...: runs it and notes how long it took
  local label=$1 start=$SECONDS
  shift
  "$@" || failed=1
  stage_times+=("$label $((SECONDS - start)) s")
}

plain=(//... "${sanitized[@]/#/-}" "${for_pytest[@]}")
echo "[test] bazel test ${plain[*]} (the first run builds libtorch-heavy code and captures the example artifacts: several minutes)"
timed bazel bazel test --nocache_test_results --keep_going --build_event_json_file="$events/bazel.json" -- "${plain[@]}"
summarize bazel "" $(bazel query "tests(//...) except tests(set(${sanitized[*]}))" 2>/dev/null)

# The fuzzers compile outside Bazel, at the lowest priority, from here on:
# the sanitizer stages keep both cores busy only while they compile, and
# their tests leave much of the machine idle while they wait on servers. On a
# fresh machine the compile took 239 s beside pytest and ran 127 s past it.
# The protos they include are the plain build's (FUZZ_GEN: no Bazel command
# of theirs contends with the stages').
fuzz_gen=$(bazel info bazel-bin 2>/dev/null)
fuzz_build_log=$events/fuzz_build.log
{
  FUZZ_GEN=$fuzz_gen FUZZ_BUILD_ONLY=1 nice -n 19 tests/fuzz/run_fuzzers.sh
  echo $? >"$events/fuzz_build.rc"
} >"$fuzz_build_log" 2>&1 &
fuzz_build_pid=$!

# Not python_eager_test here: LeakSanitizer's check at exit walks the embedded
# interpreter's memory, which is never freed (CPython is not finalized), and
# on a fresh environment took over five minutes. ThreadSanitizer runs it.
# --build_tests_only: the command-line tools' mains, which no test runs, are
# built plain only.
echo "[test] AddressSanitizer: bazel test --config=asan ${sanitized[*]} -//tests:python_eager_test"
timed asan bazel test --config=asan --build_tests_only --nocache_test_results "${stacks_on_hang[@]}" --keep_going --build_event_json_file="$events/asan.json" -- \
  "${sanitized[@]}" -//tests:python_eager_test
summarize asan --config=asan $(bazel query "tests(set(${sanitized[*]})) except //tests:python_eager_test" 2>/dev/null)
# It runs under AddressSanitizer on its own, without the leak check;
# PYTHONMALLOC=malloc puts Python's objects under AddressSanitizer too.
if bazel query //tests:python_eager_test >/dev/null 2>&1; then
  echo "[test] AddressSanitizer without LeakSanitizer: //tests:python_eager_test"
  timed asan_python bazel test --config=asan --nocache_test_results "${stacks_on_hang[@]}" --build_event_json_file="$events/asan_python.json" //tests:python_eager_test \
    --test_env=ASAN_OPTIONS=detect_leaks=0:detect_odr_violation=0 --test_env=PYTHONMALLOC=malloc
  summarize asan_python --config=asan //tests:python_eager_test
fi

# ThreadSanitizer slows everything down ~10x: the tests that exercise threads
# (concurrent calls, reloads under load, the gRPC server), not the process
# ones, nor the unit tests tagged "single_threaded" (one thread: nothing to
# race with; each would be one more file compiled a third time).
tsan_scope="//runtime/... + //server/... + //client/... + //tests:server_e2e_test
  + //tests:server_repository_test + //tests:server_batching_test
  + //tests:torch_grpc_coexistence_test + //tests:python_eager_test
  + //base:rate_limited_lines_test"
mapfile -t tsan < <(bazel query "tests($tsan_scope) except attr(tags, '\bsingle_threaded\b', tests($tsan_scope))" 2>/dev/null)
((${#tsan[@]})) || { echo "[test] bazel query of the ThreadSanitizer tests failed"; failed=1; }
echo "[test] ThreadSanitizer: bazel test --config=tsan ${tsan[*]}"
timed tsan bazel test --config=tsan "${tsan[@]}" --nocache_test_results "${stacks_on_hang[@]}" --keep_going --build_event_json_file="$events/tsan.json"
summarize tsan --config=tsan "${tsan[@]}"

# The Python tests run the binaries under bazel-bin, which the sanitizer runs
# pointed at their own builds: point it back at the plain one (cached).
bazel build --noshow_progress "${for_pytest[@]}" || failed=1

# The fuzzers run beside pytest, one at a time and niced: pytest's workers
# spend about half their time waiting on servers and captures, which left
# one of two cores idle (bench/RESULTS.md section 42). Their report follows
# pytest's.
echo "[test] fuzzing beside pytest: 5 libFuzzer targets, 20 s each, one at a time (tests/fuzz/run_fuzzers.sh)"
fuzz_log=$events/fuzz.log
fuzz_start=$SECONDS
{
  # (Not `wait`: the build is this subshell's sibling.)
  while kill -0 "$fuzz_build_pid" 2>/dev/null; do sleep 1; done
  cat "$fuzz_build_log"
  # Built, they run as they are (checking each object against the cache
  # took 77 s beside pytest); a failed build is tried again, to report.
  skip_build=0
  [[ $(cat "$events/fuzz_build.rc" 2>/dev/null) == 0 ]] && skip_build=1
  FUZZ_SKIP_BUILD=$skip_build FUZZ_GEN=$fuzz_gen FUZZ_JOBS=1 nice -n 10 tests/fuzz/run_fuzzers.sh 20
} >"$fuzz_log" 2>&1 &
fuzz_pid=$!

# A test file's tests on one worker (their module fixtures capture once), one
# worker per core up to four: much of a test's time is a server starting or
# a capture compiling on one core (on 2 cores: 190 s instead of 320 s).
# Captures run as the capture rule of bazel/capture.bzl runs them: Inductor
# takes the base vector ISAs as proven (the g++ of tools/setup.sh builds
# their probes), and each variant's C++ wrapper compiles at -O0 (its kernels
# stay -O3).
echo "[test] pytest capture/tests client/python tests/http tests/hostile tests/recapture tests/python_eager tests/monitoring tools/tests"
timed pytest env TORCHINDUCTOR_VEC_ISA_OK=1 AOT_INDUCTOR_COMPILE_WRAPPER_OPT_LEVEL=O0 .venv/bin/python3 -m pytest capture/tests client/python tests/http tests/hostile tests/recapture \
  tests/python_eager tests/monitoring tools/tests -q -p no:cacheprovider --durations=10 \
  -n auto --maxprocesses=4 --dist loadfile

fuzz_wait_start=$SECONDS
wait "$fuzz_pid" || failed=1
cat "$fuzz_log"
stage_times+=("fuzz $((SECONDS - fuzz_start)) s (of which $((SECONDS - fuzz_wait_start)) s after pytest)")

echo "[test] time per stage (setup $setup_seconds s): ${stage_times[*]/%/,}"

exit $failed
