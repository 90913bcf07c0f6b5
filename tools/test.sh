#!/usr/bin/env bash
# Sets up the machine (tools/setup.sh), builds everything and runs every test:
# the C++ tests with `bazel test`, then the capture tool's tests with pytest.
# Ends with each runner's summary: "bazel: N passed, N failed, N skipped" for
# the C++ test cases, then pytest's own line.
set -uo pipefail
cd "$(dirname "$0")/.."

tools/setup.sh || exit 1

echo "[test] bazel test //... (the first run builds libtorch-heavy code and captures the example artifacts: several minutes)"
bazel test //... --keep_going
bazel_status=$?

targets=$(bazel query 'tests(//...)' 2>/dev/null)
.venv/bin/python3 tools/test_summary.py "$(bazel info bazel-testlogs 2>/dev/null)" $targets
summary_status=$?

echo "[test] pytest capture/tests"
.venv/bin/python3 -m pytest capture/tests -q -p no:cacheprovider
pytest_status=$?

if ((bazel_status || summary_status || pytest_status)); then
  exit 1
fi
