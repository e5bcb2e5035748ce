#!/usr/bin/env python3
"""Shows that scripts/check_messages.py fires: a header over its allowance and one not listed at all
are named with their lines; a header under its allowance is reported (to lower it) without failing."""
import pathlib
import subprocess
import sys
import tempfile

checker = pathlib.Path(sys.argv[1])
with tempfile.TemporaryDirectory() as d:
    root = pathlib.Path(d) / "pipeswap"
    (root / "swap").mkdir(parents=True)
    (root / "swap" / "old.hpp").write_text('throw error("a " + std::to_string(n) + " b " + std::to_string(m));\n')
    (root / "swap" / "new.hpp").write_text('#pragma once\nthrow error("x " + std::to_string(n));\n')
    (root / "swap" / "shrunk.hpp").write_text("throw error(detail::message({\"x \", n}));\n")
    (root / "detail").mkdir()
    (root / "detail" / "message.hpp").write_text("s += std::to_string(number_);\n")
    allow = pathlib.Path(d) / "allow.txt"
    allow.write_text("# comment\n1 swap/old.hpp\n2 swap/shrunk.hpp\n")
    r = subprocess.run([sys.executable, checker, "--root", root, "--allow", allow], capture_output=True, text=True)
expected = [
    "swap/old.hpp: 2 std::to_string, 1 allowed",
    "swap/new.hpp: 1 std::to_string, 0 allowed",
    "  swap/new.hpp:2: throw error(\"x \" + std::to_string(n));",
    "swap/shrunk.hpp: 0 std::to_string, 2 allowed: lower its allowance",
    "2 header(s) over their allowance",
]
failures = [e for e in expected if e not in r.stdout]
if r.returncode != 1:
    failures.append(f"exit {r.returncode}, not 1")
if "detail/message.hpp" in r.stdout:
    failures.append("detail/message.hpp is exempt but was reported")
if failures:
    print(r.stdout)
for f in failures:
    print("FAIL:", f)
print("check_messages selftest:", "failed" if failures else "passed")
sys.exit(1 if failures else 0)
