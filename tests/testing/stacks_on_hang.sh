#!/usr/bin/env bash
# Runs a test (bazel test --run_under) and, if it is still running in the
# last 45 s before Bazel's timeout (TEST_TIMEOUT) kills it, or in the last
# quarter of a timeout under 3 minutes, writes every thread's stack to its
# log: a test that hangs, however rarely, says where it waits,
# where Bazel's timeout alone kills it without a trace. The stacks come from
# gdb (tools/setup.sh installs it); without gdb the log says so.
#
#   stacks_on_hang.sh TEST [ARGS...]
set -u

"$@" &
test_pid=$!
timeout=${TEST_TIMEOUT:-300}
margin=$((timeout / 4 < 45 ? timeout / 4 : 45))
budget=$((timeout - margin))
((budget > 0)) || budget=1
(
  for ((waited = 0; waited < budget; waited++)); do
    sleep 1
    kill -0 "$test_pid" 2>/dev/null || exit 0
  done
  echo "[stacks_on_hang] $1 still runs after ${budget} s; the stack of each of its threads:" >&2
  if command -v gdb >/dev/null; then
    gdb -p "$test_pid" -batch -nx -ex "thread apply all bt" 2>&1 | grep -v "^\[New LWP" >&2
  else
    echo "[stacks_on_hang] no gdb here (Debian: apt-get install gdb)" >&2
  fi
) &
watcher=$!
wait "$test_pid"
status=$?
wait "$watcher"
exit "$status"
