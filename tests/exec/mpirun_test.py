#!/usr/bin/env python3
"""pipeline_train under mpirun with 2, 3 and 4 processes: a sampled matrix of schedules, stages per rank,
micro-batches and swap settings must end `bit-identical: yes`; a fault on one rank must bring every
process down naming the rank and the site; a deadlocking schedule must fail within its watchdog,
each rank saying what it waited on, or at once at the executor's schedule check; ranks given
different schedules must all fail at the first step, naming the ranks and both schedules. Every run
has a watchdog of its own: a run that does not end in time is killed and reported with what it
printed.

usage: mpirun_test.py MPIRUN PIPELINE_TRAIN WORKDIR
"""
import json
import os
import subprocess
import sys
import time

mpirun, binary, work = sys.argv[1], sys.argv[2], sys.argv[3]
os.makedirs(work, exist_ok=True)
base = [mpirun, "--oversubscribe"]
if os.geteuid() == 0:
    base.append("--allow-run-as-root")
env = dict(os.environ, OMPI_MCA_btl_vader_single_copy_mechanism="none", OMPI_MCA_rmaps_base_oversubscribe="1")
failures = []


def run(np, args, timeout):
    cmd = base + ["-np", str(np), binary] + args
    t0 = time.monotonic()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = (e.stderr or b"").decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
        failures.append(f"HANG (watchdog {timeout} s): {' '.join(cmd)}\n{out}\n{err}")
        return None, out, err, timeout
    return p.returncode, p.stdout, p.stderr, time.monotonic() - t0


# The sampled matrix: each (processes, schedule) pair once, swap settings and shapes rotating.
matrix = [
    (2, ["--schedule", "gpipe", "--micro", "3", "--swap", "activations"]),
    (2, ["--schedule", "interleaved", "--stages-per-rank", "2", "--micro", "2", "--swap", "optimizer"]),
    (3, ["--schedule", "1f1b", "--micro", "5", "--swap", "both"]),
    (3, ["--schedule", "interleaved", "--stages-per-rank", "1", "--micro", "8", "--swap", "none"]),
    (4, ["--schedule", "gpipe", "--micro", "1", "--swap", "optimizer"]),
    (4, ["--schedule", "1f1b", "--micro", "8", "--swap", "activations"]),
    (4, ["--schedule", "interleaved", "--stages-per-rank", "2", "--micro", "8", "--swap", "both"]),  # the done-means run
]
small = ["--steps", "2", "--wait-timeout", "20000"]
for np, args in matrix:
    rc, out, err, took = run(np, args + small, 120)
    if rc is None:
        continue
    lines = out.strip().splitlines()
    if rc != 0 or not lines or lines[-1] != "bit-identical: yes":
        failures.append(f"np {np} {' '.join(args)}: exit {rc}, last line {lines[-1:]}\n{out}\n{err}")
    elif sum(1 for l in lines if l.startswith("rank ") and "peak device bytes" in l) != np:
        failures.append(f"np {np} {' '.join(args)}: not one peak line per rank\n{out}")
    else:
        print(f"ok: np {np} {' '.join(args)} ({took:.1f} s)")

# A fault: rank 1 throws at position 4 of its order; every process goes down, the error names the
# rank and the site, nobody prints bit-identical, and it ends long before the watchdog.
rc, out, err, took = run(3, ["--schedule", "1f1b", "--micro", "4", "--swap", "both", "--fail-rank", "1",
                             "--fail-at", "4", "--wait-timeout", "30000"], 60)
if rc is not None:
    if rc == 0 or "bit-identical" in out:
        failures.append(f"fault run: exit {rc}, it reported\n{out}\n{err}")
    elif "rank 1 failed at position 4 (" not in err or "injected fault at position 4" not in err:
        failures.append(f"fault run: the error does not name rank 1 and position 4\n{err}")
    elif took > 25:
        failures.append(f"fault run took {took:.1f} s: the watchdog, not the abort, ended it\n{err}")
    else:
        print(f"ok: fault on rank 1 at position 4 brought the job down in {took:.1f} s")

# A kernel fault inside the backend on rank 2 of 4.
rc, out, err, took = run(4, ["--schedule", "gpipe", "--micro", "2", "--fail-rank", "2", "--fail-kernel", "3",
                             "--wait-timeout", "30000"], 60)
if rc is not None:
    if rc == 0 or "bit-identical" in out or "rank 2 failed at position" not in err or "injected fault in launch" not in err:
        failures.append(f"kernel fault run: exit {rc}\n{out}\n{err}")
    else:
        print(f"ok: kernel fault on rank 2 brought the job down in {took:.1f} s")

# A deadlocking schedule: each rank waits for a message its peer sends only after its own wait.
dl = [[{"type": "FWD", "stage": 0, "micro": 0}, {"type": "BWD_RECV", "stage": 0, "micro": 0},
       {"type": "FWD_SEND", "stage": 0, "micro": 0}, {"type": "BWD", "stage": 0, "micro": 0}],
      [{"type": "FWD_RECV", "stage": 1, "micro": 0}, {"type": "FWD", "stage": 1, "micro": 0},
       {"type": "BWD", "stage": 1, "micro": 0}, {"type": "BWD_SEND", "stage": 1, "micro": 0}]]
path = os.path.join(work, "deadlock.json")
with open(path, "w") as f:
    json.dump(dl, f)
# Without the executor's schedule check the watchdog ends it, each rank saying what it waited on.
rc, out, err, took = run(2, ["--orders", path, "--wait-timeout", "1500", "--no-schedule-check"], 60)
if rc is not None:
    said = ("rank 0 waited 1500 ms at position 1 (BR0.0)" in err) or ("rank 1 waited 1500 ms at position 0 (FR1.0)" in err)
    if rc == 0 or "deadlock" not in out or not said:
        failures.append(f"deadlock run: exit {rc}; expected the validator's verdict and a watchdog naming the wait\n{out}\n{err}")
    else:
        print(f"ok: the predicted deadlock ended after {took:.1f} s naming the waits")
# With it (the default) the ranks refuse the orders at the first step, long before the watchdog.
rc, out, err, took = run(2, ["--orders", path, "--wait-timeout", "30000"], 60)
if rc is not None:
    if rc == 0 or "failed at schedule check" not in err or "rank 0 blocks at position 1 (BR0.0)" not in err:
        failures.append(f"checked deadlock run: exit {rc}; expected the schedule check's verdict\n{out}\n{err}")
    elif took > 20:
        failures.append(f"checked deadlock run took {took:.1f} s: the watchdog, not the check, ended it\n{err}")
    else:
        print(f"ok: the schedule check refused the deadlocking orders in {took:.1f} s")

# Ranks given different schedules (1F1B on ranks 0 and 2, GPipe on rank 1; then 4 ranks with GPipe on
# rank 3): every process goes down at the first step, the error names the ranks and both schedules.
for np, extra, words in [
        (3, ["--rank-schedule", "1=gpipe"], ["'1f1b micro=4 stages_per_rank=1' against 'gpipe micro=4 stages_per_rank=1'", "ranks 0 and 1"]),
        (4, ["--rank-schedule", "3=gpipe"], ["'1f1b micro=4 stages_per_rank=1' against 'gpipe micro=4 stages_per_rank=1'", "ranks 0 and 3"])]:
    rc, out, err, took = run(np, ["--schedule", "1f1b", "--micro", "4", "--wait-timeout", "30000"] + extra, 60)
    if rc is None:
        continue
    if rc == 0 or "bit-identical" in out or "failed at schedule check" not in err or any(w not in err for w in words):
        failures.append(f"mixed schedules on {np} processes: exit {rc}; expected the schedule check naming {words}\n{out}\n{err}")
    elif took > 20:
        failures.append(f"mixed schedules on {np} processes took {took:.1f} s: the watchdog ended it\n{err}")
    else:
        print(f"ok: mixed schedules on {np} processes refused on every rank in {took:.1f} s")

for f in failures:
    print("FAIL:", f, file=sys.stderr)
sys.exit(1 if failures else 0)
