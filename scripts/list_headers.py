#!/usr/bin/env python3
"""Print every public header under include/ (relative paths, sorted), for the self-containment build.

Headers under a detail/ folder are internal and are compiled through their public includers.
"""
import pathlib
import sys

root = pathlib.Path(sys.argv[1])
for p in sorted(root.rglob("*")):
    if p.suffix in (".hpp", ".cuh") and "detail" not in p.relative_to(root).parts:
        print(p.relative_to(root).as_posix())
