#!/usr/bin/env python3
"""The simulator's step time against published throughputs (docs/simulator.md, "Calibration").

For every scenario in examples/calibration/ (its comment gives the source and the published
tokens/s per GPU), simulates the no-swap step with `pipeswap simulate --json` and prints the
predicted tokens/s per GPU, M·b·s / (step · ranks · tp), and its ratio to the published figure;
and the simulated peak, against the published one where the comment gives it ("77.0 GiB at its
peak", the busiest device's; "... at its peak on the last pipeline rank", that rank's). A file whose
comment gives a peak and no throughput checks memory only ("memory only" rows, in no ratio group).

Each file belongs to a software stack, named by its file name: "torchtitan_..." runs torchtitan's
kernels, the others Megatron-Core's (NeMo). Files whose name starts with "heldout_" are held out;
the others are calibration runs. A stack's dense calibration runs fit its GEMM ceiling
(device.kernel_efficiency); the mixture-of-experts calibration runs fit the host's time per MoE
layer (model.moe.host_layer_ms, the default moe_host_layer_ms in sim/compute.hpp). `--fit` refits
them, each the value at which the geometric mean of its runs' ratios is 1 (the least squares of
their log ratios), by bisection, with every other constant at its default: the ceilings first,
then the host time at the Megatron-Core ceiling. `--efficiency E` simulates every file at the
ceiling E.

    python3 scripts/calibration.py [path/to/pipeswap] [--efficiency E] [--fit]
"""
import glob
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile


def published(comment):
    """The published tokens/s per GPU, or None for a file that checks memory only."""
    m = re.search(r":\s*([0-9][0-9,]*)\s+tokens/s per GPU", comment)
    return float(m.group(1).replace(",", "")) if m else None


def published_peak_gib(comment):
    """The published peak memory and whether it is the last pipeline rank's, where the comment gives
    one ("..., 77.0 GiB at its peak", the busiest device's; "..., 26.6 GiB at its peak on the last
    pipeline rank", the rank Megatron logs memory on), else (None, False)."""
    m = re.search(r"([0-9.]+) GiB at its peak( on the last pipeline rank)?", comment)
    return (float(m.group(1)), bool(m.group(2))) if m else (None, False)


def simulated_peak_gib(sc, none):
    """The simulated peak (GiB) that the file's published peak is compared with: the last pipeline
    rank's where the comment says so, else the busiest device's."""
    _, last_rank = published_peak_gib(sc["comment"])
    return (none["ranks"][-1] if last_rank else none)["peak_bytes"] / 2**30


def simulate(exe, path, efficiency=None, host_layer_ms=None):
    """The scenario as simulated and its no-swap configuration (`pipeswap simulate --json`), at the
    ceiling `efficiency` and the MoE host time `host_layer_ms` where given."""
    with open(path) as f:
        s = json.load(f)
    if efficiency is not None:
        s.setdefault("device", {})["kernel_efficiency"] = efficiency
    if host_layer_ms is not None:
        s["model"]["moe"]["host_layer_ms"] = host_layer_ms
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(s, f)
        name = f.name
    try:
        out = subprocess.run([exe, "simulate", "--scenario", name, "--json", "--svg", "", "--trace", ""],
                             capture_output=True, text=True)
    finally:
        os.unlink(name)
    r = json.loads(out.stdout)
    return r["scenario"], next(c for c in r["configurations"] if c["name"] == "none")


def throughput(sc, none):
    """Predicted and published tokens/s per GPU, and the simulated step in seconds, of what
    simulate() returned."""
    step = none["step_ns"] * 1e-9
    m, p, q = sc["model"], sc["pipeline"], sc["parallel"]
    tokens = p["micro_batches"] * m["micro_batch_size"] * m["seq_len"]
    return tokens / (step * p["ranks"] * q["tp"]), published(sc["comment"]), step


def predict(exe, path, efficiency=None, host_layer_ms=None):
    """throughput() of the file's simulation."""
    return throughput(*simulate(exe, path, efficiency, host_layer_ms))


def stack(path):
    """The software stack a file's run used: its name after "heldout_" starts with "torchtitan_"."""
    name = os.path.basename(path)
    return "torchtitan" if name.removeprefix("heldout_").startswith("torchtitan_") else "megatron"


def held_out(path):
    return os.path.basename(path).startswith("heldout_")


def model_kind(sc):
    """The kind of model a scenario is (a simulated one, or a file's, whose moe section may be absent),
    as sim/accuracy.hpp states an error for each."""
    return "mixture-of-experts" if sc["model"].get("moe", {}).get("experts", 0) > 0 else "dense"


def read(path):
    """A scenario file, as written."""
    with open(path) as f:
        return json.load(f)


def bisect_log_mean(paths, predict_at, lo, hi, rising):
    """The value in [lo, hi] at which the geometric mean of predicted / published over `paths` is 1,
    where predict_at(path, value) predicts and the ratio rises (or falls) with the value."""
    def log_mean(v):
        logs = []
        for p in paths:
            pred, pub, _ = predict_at(p, v)
            logs.append(math.log(pred / pub))
        return sum(logs) / len(logs)
    for _ in range(12):
        mid = (lo + hi) / 2
        if (log_mean(mid) > 0) == rising:
            hi = mid
        else:
            lo = mid
    return (lo + hi) / 2


def fit(exe, paths):
    """The ceiling at which the geometric mean of predicted / published over `paths` is 1 (a higher
    ceiling predicts faster)."""
    return bisect_log_mean(paths, lambda p, e: predict(exe, p, e), 0.2, 0.95, rising=True)


def fit_host(exe, paths):
    """The MoE host time (ms) at which the geometric mean over `paths` is 1 (a longer host time
    predicts slower, where it binds)."""
    return bisect_log_mean(paths, lambda p, h: predict(exe, p, None, h), 0.0, 40.0, rising=False)


def main():
    args = sys.argv[1:]
    eff = None
    if "--efficiency" in args:
        i = args.index("--efficiency")
        eff = float(args[i + 1])
        del args[i:i + 2]
    refit = "--fit" in args
    if refit:
        args.remove("--fit")
    exe = args[0] if args else "build/examples/pipeswap/pipeswap"
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "calibration")
    paths = sorted(glob.glob(os.path.join(root, "*.json")))
    if refit:
        files = {p: read(p) for p in paths if not held_out(p)}
        kinds = {p: model_kind(sc) for p, sc in files.items() if published(sc["comment"])}
        for name in sorted({stack(p) for p in paths}):
            runs = [p for p, k in kinds.items() if stack(p) == name and k == "dense"]
            print(f"{name}: device.kernel_efficiency {fit(exe, runs):.3f}, fitted on {len(runs)} dense calibration runs")
        runs = [p for p, k in kinds.items() if k == "mixture-of-experts"]
        print(f"mixture of experts: model.moe.host_layer_ms {fit_host(exe, runs):.2f}, "
              f"fitted on {len(runs)} calibration run{'s' if len(runs) != 1 else ''}")
        return
    groups = {}
    for path in paths:
        sc, none = simulate(exe, path, eff)
        pred, pub, step = throughput(sc, none)
        kind = "held out" if held_out(path) else "calibration"
        mem, _ = published_peak_gib(sc["comment"])
        peak = simulated_peak_gib(sc, none)
        memory = f"  peak {peak:5.1f} GiB" + (f" against {mem:5.1f} ({peak / mem:5.3f})" if mem else "")
        if pub is None:  # a memory-only file
            print(f"{'memory only':12} {os.path.basename(path):50} {'':46} step {step:7.3f} s{memory}")
            continue
        groups.setdefault(kind, []).append(pred / pub)
        groups.setdefault(f"{kind}, {model_kind(sc)}", []).append(pred / pub)
        print(f"{kind:12} {os.path.basename(path):50} published {pub:8.0f}  predicted {pred:8.0f}  "
              f"ratio {pred / pub:5.3f}  step {step:7.3f} s{memory}")
    for kind, ratios in sorted(groups.items()):
        if ratios:
            print(f"{kind}: {len(ratios)} runs, median ratio {statistics.median(ratios):.3f}, "
                  f"range {min(ratios):.3f}-{max(ratios):.3f}")


if __name__ == "__main__":
    main()
