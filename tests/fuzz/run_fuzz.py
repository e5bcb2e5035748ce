#!/usr/bin/env python3
"""Runs a libFuzzer target for a bounded number of inputs, as a Meson test.

usage: run_fuzz.py FUZZER SEED_CORPUS WORKDIR [libFuzzer flags...]
       run_fuzz.py --skip REASON          (exit 77: Meson reports SKIP with the reason)

The seed corpus is only read; new inputs go to WORKDIR/corpus and crash artifacts to WORKDIR/.
The run fails on a non-zero exit or on any sanitizer or libFuzzer error report. The libFuzzer seed
is fixed (reproducible CI) unless PIPESWAP_FUZZ_SEED is set; PIPESWAP_FUZZ_RUNS overrides -runs.
"""
import os
import pathlib
import re
import shutil
import subprocess
import sys

if len(sys.argv) >= 2 and sys.argv[1] == "--skip":
    print("SKIP: " + " ".join(sys.argv[2:]))
    sys.exit(77)

fuzzer, seeds, work = sys.argv[1:4]
flags = sys.argv[4:]
if "PIPESWAP_FUZZ_RUNS" in os.environ:
    flags = [f for f in flags if not f.startswith("-runs=")] + ["-runs=" + os.environ["PIPESWAP_FUZZ_RUNS"]]
work = pathlib.Path(work)
shutil.rmtree(work, ignore_errors=True)
(work / "corpus").mkdir(parents=True)

cmd = [fuzzer, f"-seed={os.environ.get('PIPESWAP_FUZZ_SEED', '1')}", f"-artifact_prefix={work}/",
       "-print_final_stats=1", *flags, str(work / "corpus"), seeds]
print(" ".join(cmd), flush=True)
r = subprocess.run(cmd, capture_output=True, text=True, errors="replace")
log = r.stdout + r.stderr
(work / "fuzz.log").write_text(log)

bad = [line for line in log.splitlines()
       if re.search(r"ERROR: (AddressSanitizer|LeakSanitizer|UndefinedBehaviorSanitizer|libFuzzer)"
                    r"|runtime error:|invariant broken|deadly signal", line)]
done = [line for line in log.splitlines() if line.startswith(("Done ", "stat::number_of_executed_units"))]
print("\n".join(done))
if r.returncode != 0 or bad:
    print(log[-12000:])
    print(f"FAIL: fuzzer exit {r.returncode}; {len(bad)} error line(s); artifacts in {work}")
    sys.exit(1)
print(f"no crash, no sanitizer report; new inputs in {work / 'corpus'}")
