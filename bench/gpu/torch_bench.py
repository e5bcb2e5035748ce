#!/usr/bin/env python3
"""torch_bench — SwapAdamW against a resident torch.optim.AdamW(fused=True) on one CUDA device.

About 1 B fp32 parameters (--tensors T tensors of --numel N elements each) with fixed gradients:
  resident    torch.optim.AdamW(fused=True), the state on the device;
  swap-K      pipeswap.torch.SwapAdamW(fused=True, packed=True, swap_times=K) for each K of
              --swap-times (default 8 16), prefetch on: prefetch(--prefetch, default 1 batch) is
              issued before each step (in a training loop it runs under the backward), and the time
              measured is from prefetch() to the end of step(): the whole state crosses the link
              inside it. A prefetched batch has its own device storage until its step, so the
              state's device memory is checked against two staging arenas plus the prefetched
              batches (state_within_window) and against two arenas alone (state_within_two_batches).
For each: the median step time over --steps timed steps (after one warm-up step; CUDA events on the
current stream plus a device synchronize), torch.cuda.max_memory_allocated over those steps and the
device memory the optimizer added (peak minus what was allocated before it was built: parameters,
gradients, the other runs' parameters). The link bound is measured first: 1 GiB H2D and
1 GiB D2H at once on two streams between pinned host memory and the device (the duplex rates), so
bound_ms = max(state bytes / H2D rate, state bytes / D2H rate); ratio = step ms / bound ms. After
the timed steps every parameter of every swap run must equal the resident run's, bit for bit (each
run starts from the same parameters and takes the same number of steps with the same gradients).

Output: a Markdown table on stdout and a JSON object in --out FILE.
Exit status: 0 ok; 1 a bit mismatch; 77 no CUDA device.

  python3 bench/gpu/torch_bench.py [--tensors 32] [--numel 33554432] [--swap-times 8 16] [--steps 3]
                                   [--prefetch 1] [--out FILE] [--quick] [--cpu-smoke]

--cpu-smoke runs the same code on the CPU with tiny sizes and no link measurement (no timing or
memory figure means anything there): a check of this script on a machine without a GPU.
"""

import argparse
import json
import statistics
import sys
import time

import torch

DEV = "cuda"


def sync():
    if DEV == "cuda":
        torch.cuda.synchronize()


def allocated(peak=False):
    if DEV != "cuda":
        return 0
    return torch.cuda.max_memory_allocated() if peak else torch.cuda.memory_allocated()


def duplex_rates(nbytes=1 << 30, reps=5):
    """GB/s of H2D and D2H while both run at once (two streams, pinned host memory)."""
    host_src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    host_dst = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dev_dst = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dev_src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    up, down = torch.cuda.Stream(), torch.cuda.Stream()
    best_up = best_down = 0.0
    for _ in range(reps):
        torch.cuda.synchronize()
        e = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
        with torch.cuda.stream(up):
            e[0].record()
            dev_dst.copy_(host_src, non_blocking=True)
            e[1].record()
        with torch.cuda.stream(down):
            e[2].record()
            host_dst.copy_(dev_src, non_blocking=True)
            e[3].record()
        torch.cuda.synchronize()
        best_up = max(best_up, nbytes / (e[0].elapsed_time(e[1]) * 1e6))
        best_down = max(best_down, nbytes / (e[2].elapsed_time(e[3]) * 1e6))
    del host_src, host_dst, dev_dst, dev_src
    return best_up, best_down


def make_params(tensors, numel, seed=0):
    g = torch.Generator(device=DEV).manual_seed(seed)
    return [torch.randn(numel, device=DEV, generator=g).requires_grad_() for _ in range(tensors)]


def time_run(make_opt, params, grads, steps, prefetch=None):
    for p, g in zip(params, grads):
        p.grad = g
    sync()
    if DEV == "cuda":
        torch.cuda.reset_peak_memory_stats()
    base = allocated()  # parameters, gradients and what else is alive: not the optimizer's
    opt = make_opt(params)
    opt.step()  # warm-up: the state materializes, plans and arenas are made
    sync()
    times = []
    for _ in range(steps):
        sync()
        t0 = time.perf_counter()
        if DEV == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        if prefetch is not None:
            opt.prefetch(prefetch)
        opt.step()
        if DEV == "cuda":
            end.record()
        sync()
        host_ms = (time.perf_counter() - t0) * 1e3
        times.append(max(start.elapsed_time(end), host_ms) if DEV == "cuda" else host_ms)
    peak = allocated(peak=True)
    stats = opt.swap_stats() if hasattr(opt, "swap_stats") else {}
    del opt
    return {"ms": statistics.median(times), "ms_all": times, "max_memory_allocated": peak,
            "optimizer_device_bytes": peak - base, "stats": stats}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tensors", type=int, default=32)
    ap.add_argument("--numel", type=int, default=1 << 25)
    ap.add_argument("--swap-times", type=int, nargs="+", default=[8, 16])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--prefetch", type=int, default=1, help="batches prefetch() loads before each step")
    ap.add_argument("--out", default="")
    ap.add_argument("--quick", action="store_true", help="1/8 of the size, for a smoke run")
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny sizes on the CPU: checks the script only")
    a = ap.parse_args()
    global DEV
    if a.quick:
        a.tensors = max(4, a.tensors // 8)
    if a.cpu_smoke:
        DEV, a.tensors, a.numel = "cpu", 8, 4096
    elif not torch.cuda.is_available():
        print("torch_bench: no CUDA device")
        return 77
    from pipeswap.torch import SwapAdamW  # after the device check: a CPU machine may lack the package

    n = a.tensors * a.numel
    state_bytes = n * 4 * 2  # exp_avg and exp_avg_sq, fp32
    h2d, d2h = duplex_rates() if DEV == "cuda" else (float("inf"), float("inf"))
    bound = max(state_bytes / (h2d * 1e6), state_bytes / (d2h * 1e6)) if DEV == "cuda" else float("nan")
    g = torch.Generator(device=DEV).manual_seed(1)
    grads = [torch.randn(a.numel, device=DEV, generator=g) for _ in range(a.tensors)]
    out = {"params": n, "state_bytes": state_bytes, "duplex_h2d_gbps": h2d, "duplex_d2h_gbps": d2h,
           "bound_ms": bound, "device": torch.cuda.get_device_name() if DEV == "cuda" else "cpu (smoke run)",
           "torch": torch.__version__, "runs": {}}

    ref_params = make_params(a.tensors, a.numel)
    out["runs"]["resident"] = time_run(lambda ps: torch.optim.AdamW(ps, lr=1e-4, fused=True), ref_params, grads,
                                       a.steps)
    bad = []
    for k in a.swap_times:
        params = make_params(a.tensors, a.numel)
        r = time_run(lambda ps: SwapAdamW(ps, lr=1e-4, fused=True, packed=True, swap_times=k), params, grads,
                     a.steps, prefetch=a.prefetch)
        r["ratio_to_bound"] = r["ms"] / bound
        # Two staging arenas, the state that never swaps, and the per-parameter step scalars that
        # torch's fused AdamW keeps on the device (one 512-byte allocator block each).
        st = r["stats"]
        two = 2 * st.get("arena_bytes", 0) + st.get("unswappable_bytes", 0) + 512 * a.tensors
        r["state_within_two_batches"] = r["optimizer_device_bytes"] <= two
        r["state_within_window"] = r["optimizer_device_bytes"] <= two + a.prefetch * st.get("max_batch_bytes", 0)
        r["bit_exact"] = all(torch.equal(x.view(torch.int32), y.view(torch.int32)) for x, y in zip(params, ref_params))
        if not r["bit_exact"]:
            bad.append(k)
        out["runs"][f"swap-{k}"] = r
        del params
        if DEV == "cuda":
            torch.cuda.empty_cache()

    print(f"## SwapAdamW on {out['device']} (torch {out['torch']}): {n / 1e9:.2f} B fp32 parameters, "
          f"{state_bytes / 2**30:.1f} GiB of state")
    print(f"duplex link: H2D {h2d:.1f} GB/s, D2H {d2h:.1f} GB/s at once; bound {bound:.1f} ms per step\n")
    print("| run | step ms (median) | ratio to link bound | max_memory_allocated GiB | optimizer device GiB | "
          "within 2 arenas / + prefetched | bit-exact |")
    print("|---|---|---|---|---|---|---|")
    for name, r in out["runs"].items():
        ratio = f"{r['ratio_to_bound']:.2f}" if "ratio_to_bound" in r else "—"
        exact = "—" if "bit_exact" not in r else ("yes" if r["bit_exact"] else "NO")
        within = "—" if "state_within_window" not in r else \
            f"{'yes' if r['state_within_two_batches'] else 'no'} / {'yes' if r['state_within_window'] else 'no'}"
        print(f"| {name} | {r['ms']:.1f} | {ratio} | {r['max_memory_allocated'] / 2**30:.2f} | "
              f"{r['optimizer_device_bytes'] / 2**30:.2f} | {within} | {exact} |")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(out, f, indent=1)
    if bad:
        print(f"torch_bench: swap_times {bad}: parameters differ from torch.optim.AdamW(fused=True)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
