#!/usr/bin/env python3
"""Print every header under include/ that the self-containment build compiles on its own (relative
paths, sorted).

Headers under a detail/ folder are internal and are compiled through their public includers, except
the simulator's (pipeswap/sim/detail/): the pieces of sim/pipeline.hpp, each checked on its own too.
"""
import pathlib
import sys

root = pathlib.Path(sys.argv[1])
CHECKED_DETAIL = ("pipeswap/sim/detail/",)
for p in sorted(root.rglob("*")):
    rel = p.relative_to(root).as_posix()
    if p.suffix in (".hpp", ".cuh") and ("detail" not in p.relative_to(root).parts or rel.startswith(CHECKED_DETAIL)):
        print(rel)
