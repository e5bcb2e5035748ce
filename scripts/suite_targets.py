#!/usr/bin/env python3
"""Prints the ninja targets that the tests of one Meson suite run, one per line, so a build can
compile only what those tests need (the ThreadSanitizer pass of .ci/run).

usage: suite_targets.py BUILD_DIR SUITE

A test whose program is not built by the project (a Python script) contributes the targets it
depends on instead. Exits 1 when no test is in the suite.
"""
import json
import os
import subprocess
import sys

build, suite = sys.argv[1], sys.argv[2]
tests = json.loads(subprocess.run(["meson", "introspect", "--tests", build], check=True,
                                  capture_output=True, text=True).stdout)
targets = json.loads(subprocess.run(["meson", "introspect", "--targets", build], check=True,
                                    capture_output=True, text=True).stdout)
by_file = {f: t for t in targets for f in t.get("filename", [])}
by_id = {t["id"]: t for t in targets}
build_abs = os.path.abspath(build)
out = []
for test in tests:
    if not any(s == suite or s.endswith(":" + suite) for s in test.get("suite", [])):
        continue
    wanted = [by_file[c] for c in test["cmd"] if c in by_file] + [by_id[d] for d in test.get("depends", [])
                                                                  if d in by_id]
    for t in wanted:
        for f in t["filename"]:
            rel = os.path.relpath(f, build_abs)
            if rel not in out:
                out.append(rel)
if not out:
    sys.exit(f"suite_targets.py: no test of suite {suite!r} in {build}")
print("\n".join(out))
