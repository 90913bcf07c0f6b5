#!/usr/bin/env bash
# Sets up the machine (tools/setup.sh), builds everything and runs every test:
#   1. bazel test //...      C++ unit, end-to-end and process tests, client
#                            tests, deploy tests, fuzz regressions
#   2. the runtime, server and end-to-end tests again under AddressSanitizer
#      (with leak checking) and ThreadSanitizer
#   3. the libFuzzer fuzzers (request decoding, guards, manifests, HTTP
#      requests), each for a bounded time
#   4. pytest: the capture tool, the Python client example, the HTTP/REST
#      endpoint with Triton's client and curl, hostile clients (sizes near
#      2^64, loops without end, names without end), the recapture loop (misses
#      exported, recaptured and hot-swapped under load) and Python eager
#      programs served by the embedded interpreter
# Each stage ends with its own summary line ("bazel: N passed, N failed, ..."),
# pytest's last.
set -uo pipefail
cd "$(dirname "$0")/.."

tools/setup.sh || exit 1
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

echo "[test] bazel test //... (the first run builds libtorch-heavy code and captures the example artifacts: several minutes)"
bazel test //... --keep_going --build_event_json_file="$events/bazel.json" || failed=1
summarize bazel "" $(bazel query 'tests(//...)' 2>/dev/null)

# Not python_eager_test here: LeakSanitizer's check at exit walks the embedded
# interpreter's memory, which is never freed (CPython is not finalized), and
# on a fresh environment took over five minutes. ThreadSanitizer runs it.
sanitized=(//runtime/... //server/... //client/... //tests/...)
echo "[test] AddressSanitizer: bazel test --config=asan ${sanitized[*]} -//tests:python_eager_test"
bazel test --config=asan --keep_going --build_event_json_file="$events/asan.json" -- \
  "${sanitized[@]}" -//tests:python_eager_test || failed=1
summarize asan --config=asan $(bazel query "tests(set(${sanitized[*]})) except //tests:python_eager_test" 2>/dev/null)
# It runs under AddressSanitizer on its own, without the leak check;
# PYTHONMALLOC=malloc puts Python's objects under AddressSanitizer too.
if bazel query //tests:python_eager_test >/dev/null 2>&1; then
  echo "[test] AddressSanitizer without LeakSanitizer: //tests:python_eager_test"
  bazel test --config=asan --build_event_json_file="$events/asan_python.json" //tests:python_eager_test \
    --test_env=ASAN_OPTIONS=detect_leaks=0:detect_odr_violation=0 --test_env=PYTHONMALLOC=malloc || failed=1
  summarize asan_python --config=asan //tests:python_eager_test
fi

# ThreadSanitizer slows everything down ~10x: the tests that exercise threads
# (concurrent calls, reloads under load, the gRPC server), not the process ones.
tsan=(//runtime/... //server/... //client/... //tests:server_e2e_test //tests:server_repository_test
      //tests:torch_grpc_coexistence_test //tests:python_eager_test)
echo "[test] ThreadSanitizer: bazel test --config=tsan ${tsan[*]}"
bazel test --config=tsan "${tsan[@]}" --keep_going --build_event_json_file="$events/tsan.json" ||
  failed=1
summarize tsan --config=tsan $(bazel query "tests(set(${tsan[*]}))" 2>/dev/null)

echo "[test] fuzzing: 4 libFuzzer targets, 20 s each (tests/fuzz/run_fuzzers.sh)"
tests/fuzz/run_fuzzers.sh 20 || failed=1

# The Python tests run the binaries under bazel-bin, which the sanitizer runs
# pointed at their own builds: point it back at the plain one (cached).
bazel build --noshow_progress //server:precompile_server //client:precompile_client \
  //client:precompile_load //examples:artifacts //examples:blocks //gallery:gpt2 //proto:python || failed=1

echo "[test] pytest capture/tests client/python tests/http tests/hostile tests/recapture tests/python_eager tools/tests"
.venv/bin/python3 -m pytest capture/tests client/python tests/http tests/hostile tests/recapture tests/python_eager \
  tools/tests -q -p no:cacheprovider || failed=1

exit $failed
