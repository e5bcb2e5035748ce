#!/usr/bin/env python3
"""Shows that scripts/check_floors.py fires: a made-up tree with one include that points up, one
loop between two files of one floor and one header on no floor must give exactly those three
problems, each named; the same tree without them must pass."""
import pathlib
import subprocess
import sys
import tempfile

checker = pathlib.Path(sys.argv[1])

FLOORS = """# Floors
1. `config.hpp` — macros
2. `backend/` — backends
3. `swap/` — the runtime
"""


def run(tree, files):
    for rel, text in files.items():
        p = tree / "include" / "pipeswap" / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    (tree / "floors.md").write_text(FLOORS)
    r = subprocess.run([sys.executable, checker, "--floors", tree / "floors.md", "--root",
                        tree / "include" / "pipeswap"], capture_output=True, text=True)
    return r.returncode, r.stdout


good = {
    "config.hpp": "#pragma once\n",
    "backend/a.hpp": "#pragma once\n#include <pipeswap/config.hpp>\n",
    "backend/b.hpp": "#pragma once\n#include <pipeswap/backend/a.hpp>\n",
    "swap/s.hpp": "#pragma once\n#include <pipeswap/backend/b.hpp>\n",
}
bad = dict(good)
bad["backend/a.hpp"] = "#pragma once\n#include <pipeswap/config.hpp>\n\n#include <pipeswap/swap/s.hpp>\n"
bad["swap/t.hpp"] = "#pragma once\n#include <pipeswap/swap/u.hpp>\n"
bad["swap/u.hpp"] = "#pragma once\n#include <pipeswap/swap/t.hpp>\n"
bad["sim/x.hpp"] = "#pragma once\n"

failures = []
with tempfile.TemporaryDirectory() as d:
    rc, out = run(pathlib.Path(d), good)
    if rc != 0:
        failures.append(f"a tree whose includes point down failed (exit {rc}):\n{out}")
with tempfile.TemporaryDirectory() as d:
    rc, out = run(pathlib.Path(d), bad)
    expected = [
        "backend/a.hpp:4: includes <pipeswap/swap/s.hpp>, floor 3 (swap), above its own floor 2 (backend)",
        "include loop: swap/t.hpp -> swap/u.hpp -> swap/t.hpp",
        "sim/x.hpp: on no floor ('sim' is not in the floor list)",
    ]
    if rc != 1:
        failures.append(f"the bad tree exited {rc}, not 1")
    for e in expected:
        if e not in out:
            failures.append(f"missing from the output: {e}")
    # backend/a.hpp -> swap/s.hpp -> backend/b.hpp -> backend/a.hpp is a loop too (through the
    # upward include): 4 problems in all.
    if "4 problem(s)" not in out:
        failures.append("expected 4 problems")
    if failures:
        print(out)
for f in failures:
    print("FAIL:", f)
print("check_floors selftest:", "failed" if failures else "passed")
sys.exit(1 if failures else 0)
