#!/usr/bin/env python3
"""Checks that pipeswap's optimizer math gives the same bits whatever the fp-contraction flags.

    contract_check.py FAST_EXE OFF_EXE [--cxx CLANGXX --source contract_probe.cpp --include DIR
                                        --workdir DIR]

FAST_EXE / OFF_EXE are contract_probe built by the project's compiler with -O2 -march=haswell and
-ffp-contract=fast / off. With --cxx, the probe is also compiled with that compiler (clang++) both
ways. Every build must print the same `ops`, `adam` and `scalars` digests; within each compiler the
`control` digest (plain a*b+c) must differ between fast and off, which shows the flags really
contracted. Exits 77 (skip) when the probe reports a CPU without FMA.
"""
import argparse
import os
import subprocess
import sys


def run_probe(exe):
    r = subprocess.run([exe], capture_output=True, text=True)
    if r.returncode == 77:
        print(r.stdout.strip())
        sys.exit(77)
    if r.returncode != 0:
        sys.exit(f"{exe} failed ({r.returncode}): {r.stdout}{r.stderr}")
    return dict(line.split() for line in r.stdout.splitlines())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("fast")
    ap.add_argument("off")
    ap.add_argument("--cxx")
    ap.add_argument("--source")
    ap.add_argument("--include")
    ap.add_argument("--workdir")
    a = ap.parse_args()

    builds = {"project-compiler": {"fast": run_probe(a.fast), "off": run_probe(a.off)}}
    if a.cxx:
        name = os.path.basename(a.cxx)
        jobs = {}
        for mode in ("fast", "off"):  # both compiles at once
            exe = os.path.join(a.workdir, f"contract_probe_{name}_{mode}")
            cmd = [a.cxx, "-std=c++20", "-O2", "-march=haswell", f"-ffp-contract={mode}",
                   "-DPIPESWAP_PROBE_NEEDS_FMA", "-I", a.include, a.source, "-o", exe]
            jobs[mode] = (exe, cmd, subprocess.Popen(cmd, stdout=subprocess.PIPE,
                                                     stderr=subprocess.PIPE, text=True))
        builds[name] = {}
        for mode, (exe, cmd, proc) in jobs.items():
            _, err = proc.communicate()
            if proc.returncode != 0:
                sys.exit(f"compiling the probe failed: {' '.join(cmd)}\n{err}")
            builds[name][mode] = run_probe(exe)

    failed = False
    reference = builds["project-compiler"]["off"]
    for compiler, modes in builds.items():
        for mode, out in modes.items():
            print(f"{compiler:18} -ffp-contract={mode:4}  " +
                  "  ".join(f"{k} {out[k]}" for k in ("control", "ops", "adam", "scalars")))
            for key in ("ops", "adam", "scalars"):
                if out[key] != reference[key]:
                    print(f"FAIL: {compiler} -ffp-contract={mode}: {key} digest differs")
                    failed = True
        if modes["fast"]["control"] == modes["off"]["control"]:
            print(f"FAIL: {compiler}: -ffp-contract=fast did not change plain a*b+c; "
                  "the flags did not contract, so this check proves nothing")
            failed = True
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
