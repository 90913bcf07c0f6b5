"""tests/testing/stacks_on_hang.sh, which tools/test.sh runs the sanitizer
tests under: a test still running near its timeout gets every thread's
stack in its log; one that ends in time keeps its output and exit status."""

import os
import pathlib
import subprocess
import sys

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "tests" / "testing" / "stacks_on_hang.sh"


def run(program: str, test_timeout: int) -> subprocess.CompletedProcess:
    env = dict(os.environ, TEST_TIMEOUT=str(test_timeout))
    return subprocess.run([str(SCRIPT), sys.executable, "-c", program], env=env,
                          capture_output=True, text=True, timeout=120)


def test_a_test_that_ends_in_time_keeps_its_output_and_status():
    r = run("import sys; print('out'); sys.exit(3)", 300)
    assert r.returncode == 3
    assert r.stdout == "out\n"
    assert "stacks_on_hang" not in r.stderr


def test_a_test_still_running_near_its_timeout_writes_each_threads_stack():
    # A timeout of 4 s keeps its last quarter for the stacks, which come
    # after 3 s; the test then ends by itself, with its own status.
    program = ("import sys, threading, time\n"
               "threading.Thread(target=time.sleep, args=(6,)).start()\n"
               "time.sleep(6)\n"
               "sys.exit(5)\n")
    r = run(program, 4)
    assert r.returncode == 5, r.stderr
    assert "still runs after 3 s; the stack of each of its threads:" in r.stderr
    threads = [line for line in r.stderr.splitlines() if line.startswith("Thread ")]
    assert len(threads) == 2, r.stderr
    assert "sleep" in r.stderr, r.stderr
