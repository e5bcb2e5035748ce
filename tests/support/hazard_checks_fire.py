#!/usr/bin/env python3
"""Shows that every PIPESWAP_CHECK_NO_HAZARDS in a test program can fail.

    hazard_checks_fire.py [ARG...] -- PROGRAM MUTATION_HPP SOURCE...

PROGRAM is the test program built with PIPESWAP_MUTATION_TESTING and tests/support/mutate_from_env.cpp;
SOURCE are its test files; ARG are the program's arguments (--run_test=... to run only the cases that
hold the checks). The program runs once per wait site of MUTATION_HPP with that site's
waits skipped (PIPESWAP_MUTATE_SITE); each run's failing checks print `hazard check fired at
FILE:LINE` (tests/support/no_hazards.hpp). Every check of the sources must fire under at least one
site; the ones that do not are named, and the script exits 1. Without any mutation the program
must pass."""
import os
import pathlib
import re
import subprocess
import sys

argv = sys.argv[1:]
split = argv.index("--") if "--" in argv else -1
program_args = argv[:split] if split >= 0 else []
program, mutation_hpp, *sources = argv[split + 1:]
sources = [s for s in sources if s.endswith((".cpp", ".hpp"))]
sites = re.findall(r"^\s*(\w+),\s*///", pathlib.Path(mutation_hpp).read_text(), re.M)
if not sites:
    sys.exit(f"no wait sites found in {mutation_hpp}")

checks = set()
for src in sources:
    for i, line in enumerate(pathlib.Path(src).read_text().splitlines(), 1):
        if "PIPESWAP_CHECK_NO_HAZARDS(" in line and "#define" not in line:
            checks.add((pathlib.Path(src).name, i))
if not checks:
    sys.exit("no PIPESWAP_CHECK_NO_HAZARDS in the sources")

env = dict(os.environ, BOOST_TEST_COLOR_OUTPUT="no")
clean = subprocess.run([program, *program_args], env=env, capture_output=True, text=True)
if clean.returncode != 0:
    print(clean.stdout[-3000:], clean.stderr[-3000:])
    sys.exit(f"{program} fails without a mutation (exit {clean.returncode})")

fired = {}
for site in sites:
    r = subprocess.run([program, *program_args], env=dict(env, PIPESWAP_MUTATE_SITE=site), capture_output=True, text=True,
                       timeout=600)
    got = {(pathlib.Path(f).name, int(n)) for f, n in re.findall(r"hazard check fired at (\S+):(\d+)", r.stderr)}
    for c in got:
        fired.setdefault(c, site)
    print(f"{site}: {len(got & checks)} of the {len(checks)} checks fire")

missing = sorted(checks - fired.keys())
for f, n in sorted(checks & fired.keys()):
    print(f"  {f}:{n} fires without {fired[(f, n)]}")
for f, n in missing:
    print(f"NEVER FIRES: {f}:{n}")
print(f"{len(checks) - len(missing)} of {len(checks)} hazard checks fire under some mutation")
sys.exit(1 if missing else 0)
