"""Counts the C++ test cases Bazel ran, from each test target's JUnit XML.

Usage: test_summary.py [--label LABEL] BAZEL_TESTLOGS //pkg:target...
Prints "LABEL: N passed, N failed, N skipped" (LABEL defaults to "bazel"; a
target that crashed before writing its results counts as one failed case) and
exits 1 if any failed.
"""

import os
import sys
import xml.etree.ElementTree as ET


def count(testlogs: str, target: str):
    package, name = target.lstrip("/").split(":")
    xml = os.path.join(testlogs, package, name, "test.xml")
    passed = failed = skipped = 0
    try:
        root = ET.parse(xml).getroot()
    except (OSError, ET.ParseError):
        return 0, 1, 0
    cases = root.iter("testcase")
    found = False
    for case in cases:
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


def main(label: str, testlogs: str, targets) -> int:
    totals = [0, 0, 0]
    for target in targets:
        for i, n in enumerate(count(testlogs, target)):
            totals[i] += n
    print(f"{label}: {totals[0]} passed, {totals[1]} failed, {totals[2]} skipped")
    return 1 if totals[1] else 0


if __name__ == "__main__":
    args = sys.argv[1:]
    label = "bazel"
    if args[:1] == ["--label"]:
        label, args = args[1], args[2:]
    sys.exit(main(label, args[0], args[1:]))
