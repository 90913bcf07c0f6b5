"""Counts the test cases Bazel ran, from each test target's JUnit XML.

Usage: test_summary.py [--label LABEL] --bep BEP_JSON BAZEL_TESTLOGS //pkg:target...

BEP_JSON is the build event file of the `bazel test` run being summarized
(--build_event_json_file): it says which targets ran (or were answered from
the cache) in that run and how they ended. A target it has no result for
(one that failed to build, or was never reached) counts as one failed case:
the test.xml left in BAZEL_TESTLOGS by an earlier run is not a result. So
does a target Bazel says failed whose XML shows no failure, and one that ran
but left no readable XML.

Prints "LABEL: N passed, N failed, N skipped" (LABEL defaults to "bazel")
and exits 1 if any failed.
"""

import glob
import json
import os
import sys
import xml.etree.ElementTree as ET

# Bazel's overall test statuses that mean the target passed.
PASSED = {"PASSED", "FLAKY"}


def bazel_statuses(bep: str) -> dict:
    """Target label -> its overallStatus in the build event file."""
    statuses = {}
    with open(bep) as f:
        for line in f:
            event = json.loads(line)
            summary = event.get("id", {}).get("testSummary")
            if summary:
                statuses[summary["label"]] = event.get("testSummary", {}).get("overallStatus", "NO_STATUS")
    return statuses


def _xml_files(testlogs: str, package: str, name: str) -> list:
    """The target's test.xml, or one per shard of a sharded test (the shard
    count of its newest run: directories of another count may be left)."""
    base = os.path.join(testlogs, package, name)
    whole = os.path.join(base, "test.xml")
    shards = glob.glob(os.path.join(base, "shard_*_of_*", "test.xml"))
    if not shards:
        return [whole]
    newest = max(shards + ([whole] if os.path.exists(whole) else []), key=os.path.getmtime)
    if newest == whole:
        return [whole]
    total = int(os.path.basename(os.path.dirname(newest)).rsplit("_of_", 1)[1])
    return [os.path.join(base, f"shard_{i}_of_{total}", "test.xml") for i in range(1, total + 1)]


def _count_one_xml(xml: str):
    passed = failed = skipped = 0
    try:
        root = ET.parse(xml).getroot()
    except (OSError, ET.ParseError):
        return None
    found = False
    for case in root.iter("testcase"):
        found = True
        if case.find("failure") is not None or case.find("error") is not None:
            failed += 1
        elif case.get("status") == "notrun" or case.find("skipped") is not None:
            skipped += 1
        else:
            passed += 1
    if not found:
        # A test that is not GoogleTest: Bazel writes one entry for the target.
        failed = int(root.get("failures", "0") != "0" or root.get("errors", "0") != "0")
        passed = 1 - failed
    return passed, failed, skipped


def count_xml(testlogs: str, target: str):
    """(passed, failed, skipped) from the target's test.xml (every shard's),
    or None if one is missing or unreadable."""
    package, name = target.lstrip("/").split(":")
    totals = [0, 0, 0]
    for xml in _xml_files(testlogs, package, name):
        counted = _count_one_xml(xml)
        if counted is None:
            return None
        totals = [t + n for t, n in zip(totals, counted)]
    return tuple(totals)


def count(testlogs: str, target: str, statuses: dict):
    status = statuses.get(target)
    if status is None or status == "NO_STATUS":
        print(f"  {target}: no result in this run (it did not build, or was not reached)")
        return 0, 1, 0
    counted = count_xml(testlogs, target)
    if counted is None:
        print(f"  {target}: {status}, and no readable test.xml")
        return 0, 1, 0
    passed, failed, skipped = counted
    if status not in PASSED and failed == 0:
        print(f"  {target}: {status}")
        return passed, 1, skipped
    return counted


def main(label: str, bep: str, testlogs: str, targets) -> int:
    statuses = bazel_statuses(bep)
    totals = [0, 0, 0]
    for target in targets:
        for i, n in enumerate(count(testlogs, target, statuses)):
            totals[i] += n
    print(f"{label}: {totals[0]} passed, {totals[1]} failed, {totals[2]} skipped")
    return 1 if totals[1] else 0


if __name__ == "__main__":
    args = sys.argv[1:]
    label = "bazel"
    if args[:1] == ["--label"]:
        label, args = args[1], args[2:]
    if args[:1] != ["--bep"] or len(args) < 3:
        sys.exit(__doc__)
    sys.exit(main(label, args[1], args[2], args[3:]))
