#!/usr/bin/env python3
"""The simulator's step time against published throughputs (docs/simulator.md, "Calibration").

For every scenario in examples/calibration/ (its comment gives the source and the published
tokens/s per GPU), simulates the no-swap step with `pipeswap simulate --json` and prints the
predicted tokens/s per GPU, M·b·s / (step · ranks · tp), and its ratio to the published figure.

    python3 scripts/calibration.py [path/to/pipeswap] [--efficiency E]
"""
import glob
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile


def published(comment):
    m = re.search(r":\s*([0-9][0-9,]*)\s+tokens/s per GPU", comment)
    return float(m.group(1).replace(",", ""))


def predict(exe, path, efficiency=None):
    with open(path) as f:
        s = json.load(f)
    if efficiency is not None:
        s.setdefault("device", {})["kernel_efficiency"] = efficiency
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(s, f)
        name = f.name
    try:
        out = subprocess.run([exe, "simulate", "--scenario", name, "--json", "--svg", "", "--trace", ""],
                             capture_output=True, text=True)
    finally:
        os.unlink(name)
    r = json.loads(out.stdout)
    sc = r["scenario"]
    step = next(c for c in r["configurations"] if c["name"] == "none")["step_ns"] * 1e-9
    m, p, q = sc["model"], sc["pipeline"], sc["parallel"]
    tokens = p["micro_batches"] * m["micro_batch_size"] * m["seq_len"]
    return tokens / (step * p["ranks"] * q["tp"]), published(sc["comment"]), step


def main():
    args = sys.argv[1:]
    eff = None
    if "--efficiency" in args:
        i = args.index("--efficiency")
        eff = float(args[i + 1])
        del args[i:i + 2]
    exe = args[0] if args else "build/examples/pipeswap/pipeswap"
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "calibration")
    groups = {"calibration": [], "held out": []}
    for path in sorted(glob.glob(os.path.join(root, "*.json"))):
        pred, pub, step = predict(exe, path, eff)
        kind = "held out" if os.path.basename(path).startswith("heldout_") else "calibration"
        groups[kind].append(pred / pub)
        print(f"{kind:12} {os.path.basename(path):50} published {pub:8.0f}  predicted {pred:8.0f}  "
              f"ratio {pred / pub:5.3f}  step {step:7.3f} s")
    for kind, ratios in groups.items():
        if ratios:
            print(f"{kind}: median ratio {statistics.median(ratios):.3f}, range {min(ratios):.3f}-{max(ratios):.3f}")


if __name__ == "__main__":
    main()
