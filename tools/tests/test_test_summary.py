"""tools/test_summary.py counts only what the summarized Bazel run reports."""

import json
import os
import pathlib
import subprocess
import sys

SCRIPT = pathlib.Path(__file__).resolve().parents[1] / "test_summary.py"

GTEST_XML = """<?xml version="1.0" encoding="UTF-8"?>
<testsuites tests="3" failures="{failures}" errors="0">
  <testsuite name="S" tests="3">
    <testcase name="a" status="run"/>
    <testcase name="b" status="run">{failure}</testcase>
    <testcase name="c" status="notrun"/>
  </testsuite>
</testsuites>
"""


def run(tmp_path, statuses, xmls):
    testlogs = tmp_path / "testlogs"
    for target, xml in xmls.items():
        package, name = target.lstrip("/").split(":")
        (testlogs / package / name).mkdir(parents=True)
        (testlogs / package / name / "test.xml").write_text(xml)
    bep = tmp_path / "bep.json"
    bep.write_text("".join(
        json.dumps({"id": {"testSummary": {"label": t}}, "testSummary": {"overallStatus": s}}) + "\n"
        for t, s in statuses.items()))
    targets = sorted(set(statuses) | set(xmls))
    return subprocess.run([sys.executable, str(SCRIPT), "--label", "x", "--bep", str(bep),
                           str(testlogs), *targets], capture_output=True, text=True)


def test_counts_the_cases_of_targets_that_ran(tmp_path):
    r = run(tmp_path, {"//p:t": "PASSED"}, {"//p:t": GTEST_XML.format(failures=0, failure="")})
    assert r.returncode == 0
    assert r.stdout.splitlines()[-1] == "x: 2 passed, 0 failed, 1 skipped"


def test_a_target_that_did_not_run_is_a_failure_whatever_xml_is_left(tmp_path):
    # //p:stale failed to build: the run has no result for it, only an old test.xml.
    r = run(tmp_path, {"//p:t": "PASSED"}, {"//p:t": GTEST_XML.format(failures=0, failure=""),
                                            "//p:stale": GTEST_XML.format(failures=0, failure="")})
    assert r.returncode == 1
    assert "//p:stale: no result in this run" in r.stdout
    assert r.stdout.splitlines()[-1] == "x: 2 passed, 1 failed, 1 skipped"


def test_failures_count_from_the_xml_or_from_bazel(tmp_path):
    r = run(tmp_path, {"//p:t": "FAILED", "//p:timeout": "TIMEOUT"},
            {"//p:t": GTEST_XML.format(failures=1, failure="<failure/>"),
             "//p:timeout": GTEST_XML.format(failures=0, failure="")})
    assert r.returncode == 1
    assert r.stdout.splitlines()[-1] == "x: 3 passed, 2 failed, 2 skipped"


def test_a_sharded_target_counts_every_shard_of_its_newest_run(tmp_path):
    r = run(tmp_path, {"//p:t": "PASSED"}, {})
    base = tmp_path / "testlogs" / "p" / "t"
    # Left by an earlier run with three shards, then two shards now.
    (base / "shard_1_of_3").mkdir(parents=True)
    (base / "shard_1_of_3" / "test.xml").write_text(GTEST_XML.format(failures=1, failure="<failure/>"))
    os.utime(base / "shard_1_of_3" / "test.xml", (0, 0))
    for i in (1, 2):
        (base / f"shard_{i}_of_2").mkdir()
        (base / f"shard_{i}_of_2" / "test.xml").write_text(GTEST_XML.format(failures=0, failure=""))
    r = subprocess.run(r.args, capture_output=True, text=True)
    assert r.stdout.splitlines()[-1] == "x: 4 passed, 0 failed, 2 skipped"
    # A shard without its XML is a failure.
    (base / "shard_2_of_2" / "test.xml").unlink()
    r = subprocess.run(r.args, capture_output=True, text=True)
    assert r.returncode == 1 and r.stdout.splitlines()[-1] == "x: 0 passed, 1 failed, 0 skipped"
