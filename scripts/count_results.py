#!/usr/bin/env python3
"""Counts results in Meson's testlog.json files and pytest's JUnit XML files and prints
`N passed, N failed`.

usage: count_results.py [--quiet] LOG [LOG ...]   (a missing log counts as one failure: the build broke)
A LOG ending in .xml is JUnit XML (pytest --junitxml): each test case counts once. Skipped tests
(exit 77, e.g. GPU tests without a GPU; pytest skips) are listed but counted as neither.
"""
import json
import sys
import xml.etree.ElementTree as ET

PASS = {"OK", "EXPECTEDFAIL"}
SKIP = {"SKIP"}

passed = failed = skipped = 0
quiet = "--quiet" in sys.argv
for path in [a for a in sys.argv[1:] if a != "--quiet"]:
    try:
        lines = open(path, encoding="utf-8").read().splitlines()
    except OSError:
        print(f"{path}: missing (the build failed before any test ran)")
        failed += 1
        continue
    if path.endswith(".xml"):
        try:
            cases = ET.fromstring("\n".join(lines)).iter("testcase")
        except ET.ParseError as e:
            print(f"{path}: unreadable ({e})")
            failed += 1
            continue
        for case in cases:
            name = f"{case.get('classname')}::{case.get('name')}"
            if case.find("failure") is not None or case.find("error") is not None:
                failed += 1
                print(f"FAILED (pytest): {name}")
            elif case.find("skipped") is not None:
                skipped += 1
                if not quiet:
                    print(f"skipped: {name}")
            else:
                passed += 1
        continue
    for line in lines:
        if not line.strip():
            continue
        r = json.loads(line)
        res = r.get("result")
        if res in PASS:
            passed += 1
        elif res in SKIP:
            skipped += 1
            if not quiet:
                print(f"skipped: {r.get('name')}")
        else:
            failed += 1
            print(f"FAILED ({res}): {r.get('name')}")
if skipped and not quiet:
    print(f"{skipped} skipped")
print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
