"""FSDP2 with one rank and a DCP round trip, on CUDA (bench/gpu/torch_check.sh runs it; --cpu runs
the same on the CPU with gloo, as a check of this script without a GPU).

1. A model of ~34 M parameters (8 blocks of two Linear(1024, 2048/1024)), fully_shard'ed per block
   over a one-rank mesh with MixedPrecisionPolicy(bfloat16, float32), trains STEPS steps twice from
   one seed: with torch.optim.AdamW and with pipeswap.torch.SwapAdamW (swap_times 4, default
   min_swap_numel). Every parameter and state tensor must be bit for bit the same after every step;
   the host store must hold the swapped state's bytes exactly.
2. Over 20 more SwapAdamW steps: pinned host bytes (the store) and torch's cudaMalloc count
   (memory_stats' segment.all.allocated) must not grow.
3. DCP: get_optimizer_state_dict(flatten_optimizer_state_dict=True) + dcp.save into a temporary
   directory; a fresh model and SwapAdamW; dcp.load + set_*_state_dict; the device peak during the
   load (max_memory_allocated above what was allocated before it) must stay within the step's
   peak; then 3 more steps must match the uninterrupted torch.optim.AdamW run bit for bit.
4. A full_state_dict + cpu_offload round trip, reported (not a failure) if DCP refuses it.

Prints a summary and writes --json. Exit status 0 when every check passed, 1 otherwise. Within about
a minute on an H200 (most of it process start and the first CUDA kernels).
"""

import argparse
import json
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                     get_optimizer_state_dict, set_model_state_dict,
                                                     set_optimizer_state_dict)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

import pipeswap.torch as pt

HYPER = dict(lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
STEPS = 4


def build(device, width, blocks):
    torch.manual_seed(0)
    m = nn.Sequential(*[nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width))
                        for _ in range(blocks)]).to(device)
    mesh = init_device_mesh(device.type, (1,))
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for b in m:
        fully_shard(b, mesh=mesh, mp_policy=mp)
    fully_shard(m, mesh=mesh, mp_policy=mp)
    return m


def step(m, opt, k, device, width):
    g = torch.Generator(device=device).manual_seed(k)
    x = torch.randn(16, width, device=device, generator=g)
    m(x).float().square().mean().backward()
    opt.step()
    opt.zero_grad()


def bits(t):
    t = t.to_local() if hasattr(t, "to_local") else t
    t = t.detach().contiguous()
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def differences(m_ref, ref, m, opt):
    bad = []
    for (name, p), q in zip(m_ref.named_parameters(), m.parameters()):
        if not torch.equal(bits(p).cpu(), bits(q).cpu()):
            bad.append(name)
        for key, v in ref.state[p].items():
            if not torch.equal(bits(v).cpu(), bits(opt.state[q][key]).cpu()):
                bad.append(f"{name}.{key}")
    return bad


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cpu", action="store_true", help="gloo on the CPU, small model (a check of the script)")
    ap.add_argument("--quick", action="store_true", help="2 blocks instead of 8")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    device = torch.device("cpu" if a.cpu else "cuda")
    width, blocks = (64, 2) if a.cpu else (1024, 2 if a.quick else 8)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29531")
    dist.init_process_group("gloo" if a.cpu else "nccl", rank=0, world_size=1)
    if device.type == "cuda":
        torch.cuda.set_device(0)
    t0 = time.perf_counter()
    fig, failed = {"device": str(device), "width": width, "blocks": blocks}, []

    # 1. bit-identity under FSDP2 with one rank
    m_ref, m = build(device, width, blocks), build(device, width, blocks)
    fig["params"] = sum(p.numel() for p in m.parameters())
    ref = torch.optim.AdamW(m_ref.parameters(), **HYPER)
    opt = pt.SwapAdamW(m.parameters(), **HYPER, swap_times=4)
    for k in range(STEPS):
        step(m_ref, ref, k, device, width)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        step(m, opt, k, device, width)
        bad = differences(m_ref, ref, m, opt)
        if bad:
            failed.append(f"step {k}: {len(bad)} tensors differ, first {bad[:3]}")
    fig["step_peak_bytes"] = torch.cuda.max_memory_allocated() if device.type == "cuda" else None
    want = sum(2 * p.to_local().numel() * 4 for p in m.parameters() if p.to_local().numel() >= 1024)
    stats = opt.swap_stats()
    fig["host_store_bytes"] = stats["host_store_bytes"]
    if stats["host_store_bytes"] != want:
        failed.append(f"host store {stats['host_store_bytes']} bytes, swapped state {want}")

    # 2. flat over 20 more steps
    seg = (lambda: torch.cuda.memory_stats().get("segment.all.allocated", 0)) if device.type == "cuda" else (lambda: 0)
    before = (opt.swap_stats()["host_store_bytes"], opt.swap_stats()["arena_bytes"], seg())
    for k in range(STEPS, STEPS + 20):  # SwapAdamW alone in the window, the reference after it
        step(m, opt, k, device, width)
    after = (opt.swap_stats()["host_store_bytes"], opt.swap_stats()["arena_bytes"], seg())
    for k in range(STEPS, STEPS + 20):
        step(m_ref, ref, k, device, width)
    fig["store_arena_segments_before_after_20_steps"] = [before, after]
    if after != before:
        failed.append(f"host store, arena bytes or cudaMalloc count moved over 20 steps: {before} -> {after}")
    bad = differences(m_ref, ref, m, opt)
    if bad:
        failed.append(f"after 20 more steps: {len(bad)} tensors differ")

    # 3. DCP round trip through dcp.save / dcp.load, flattened
    options = StateDictOptions(flatten_optimizer_state_dict=True)
    with tempfile.TemporaryDirectory() as d:
        dcp.save({"model": get_model_state_dict(m, options=options),
                  "optim": get_optimizer_state_dict(m, opt, options=options)}, checkpoint_id=d)
        m2 = build(device, width, blocks)
        opt2 = pt.SwapAdamW(m2.parameters(), **HYPER, swap_times=4)
        if device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        sd = {"model": get_model_state_dict(m2, options=options),
              "optim": get_optimizer_state_dict(m2, opt2, options=options)}
        dcp.load(sd, checkpoint_id=d)
        set_model_state_dict(m2, sd["model"], options=options)
        set_optimizer_state_dict(m2, opt2, sd["optim"], options=options)
        if device.type == "cuda":
            torch.cuda.synchronize()
            load_peak = torch.cuda.max_memory_allocated() - base
            fig["dcp_load_peak_above_base_bytes"] = load_peak
            if load_peak > fig["step_peak_bytes"]:
                failed.append(f"the DCP load peaked {load_peak} bytes above its base, "
                              f"the step {fig['step_peak_bytes']}")
    n0 = STEPS + 20
    for k in range(n0, n0 + 3):
        step(m_ref, ref, k, device, width)
        step(m2, opt2, k, device, width)
        bad = differences(m_ref, ref, m2, opt2)
        if bad:
            failed.append(f"resumed step {k}: {len(bad)} tensors differ, first {bad[:3]}")
    del m2, opt2, sd

    # 4. full_state_dict + cpu_offload (reported)
    full = StateDictOptions(full_state_dict=True, cpu_offload=True)
    try:
        msd, osd = get_model_state_dict(m, options=full), get_optimizer_state_dict(m, opt, options=full)
        m3 = build(device, width, blocks)
        opt3 = pt.SwapAdamW(m3.parameters(), **HYPER, swap_times=4)
        set_model_state_dict(m3, msd, options=full)
        set_optimizer_state_dict(m3, opt3, osd, options=full)
        bad = differences(m, opt, m3, opt3)  # the source: m_ref went 3 steps further
        fig["full_state_dict"] = "bit-identical" if not bad else f"{len(bad)} tensors differ"
        if bad:
            failed.append(f"full_state_dict round trip: {len(bad)} tensors differ")
    except Exception as e:  # reported: docs/pytorch.md expects a refusal on CUDA (Device mismatch)
        fig["full_state_dict"] = f"refused: {type(e).__name__}: {str(e)[:200]}"

    fig["seconds"] = round(time.perf_counter() - t0, 1)
    fig["failed"] = failed
    print("## FSDP2 (one rank) and DCP with SwapAdamW")
    for k, v in fig.items():
        print(f"- {k}: {v}")
    print("torch_fsdp_check:", "FAILED" if failed else "passed")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(fig, f, indent=1)
    dist.destroy_process_group()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
