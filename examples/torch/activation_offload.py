#!/usr/bin/env python3
"""Activation offload on one device: a small transformer trains as the first stage of a pipeline.

The first stage of a pipeline runs the most forwards before their backwards (with 1F1B on P stages,
P micro-batches in flight), so it holds the most saved activations. This example runs one device
through rank 0's order of such a schedule — the model (examples/torch/gpt.py) is the stage, its
loss is taken right away — twice from the same seed: without activation swap, and with
pipeswap.torch.ActivationSwap. It reports the peak memory of each (torch's peak allocated on CUDA;
on the CPU, the saved activations pipeswap counts), the bytes moved, the step time, and checks that
every gradient is bit for bit the same.

    python3 examples/torch/activation_offload.py                 # CPU, a few seconds
    python3 examples/torch/activation_offload.py --device cuda --dim 2048 --layers 18 --seq 2048

--simulate PIPESWAP writes a scenario of the same shape (the model as rank 0's stage of a pipeline
of --stages ranks, BF16, GELU MLP, flash attention) and runs `PIPESWAP simulate` on it, so the
measured figures stand next to the simulator's prediction. --json FILE writes every figure.
Exit status: 0, or 1 if a gradient differs.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt import gpt_stages, loss_fn, parameter_count  # noqa: E402

import pipeswap.torch as pt  # noqa: E402


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu")
    p.add_argument(
        "--dtype",
        default=None,
        choices=["float32", "bfloat16"],
        help="parameters and activations (default: bfloat16 on CUDA, float32 on the CPU)",
    )
    p.add_argument("--vocab", type=int, default=2048)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--batch", type=int, default=2, help="sequences per micro-batch")
    p.add_argument("--micro", type=int, default=8, help="micro-batches per step")
    p.add_argument("--stages", type=int, default=4, help="pipeline depth whose first stage this emulates")
    p.add_argument("--schedule", default="1f1b", choices=["1f1b", "gpipe"])
    p.add_argument("--steps", type=int, default=3, help="timed steps (after one warm-up step)")
    p.add_argument(
        "--min-bytes",
        type=int,
        default=1 << 16,
        help="saved storages smaller than this stay (the library's default is 1 MiB; this "
        "example's default shape has smaller ones)",
    )
    p.add_argument("--load-lookahead", type=int, default=1)
    p.add_argument("--offload-wait-delay", type=int, default=1)
    p.add_argument("--simulate", metavar="PIPESWAP", help="the pipeswap command, to compare with its prediction")
    p.add_argument("--json", metavar="FILE")
    return p.parse_args()


def run(args, offload):
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    model = gpt_stages(args.vocab, args.dim, args.layers, args.heads, 1, device=device, dtype=dtype)[0]
    order = [e for e in pt.schedule_orders(args.schedule, args.stages, args.micro)[0]]
    swap = pt.ActivationSwap(
        device,
        order,
        offload=offload,
        min_bytes=args.min_bytes,
        load_lookahead=args.load_lookahead,
        offload_wait_delay=args.offload_wait_delay,
    )
    g = torch.Generator().manual_seed(7)
    xs = [torch.randint(0, args.vocab, (args.batch, args.seq), generator=g).to(device) for _ in range(args.micro)]
    ys = [torch.randint(0, args.vocab, (args.batch, args.seq), generator=g).to(device) for _ in range(args.micro)]
    steps = [e for e in swap.order if e is not None and e[0] in ("FWD", "BWD")]
    cuda = device.type == "cuda"
    times, peak = [], None
    for step in range(args.steps + 1):
        model.zero_grad(set_to_none=False)
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        losses = {}
        for k, s, m in steps:
            if k == "FWD":
                with swap.forward(s, m):
                    losses[m] = loss_fn(model(xs[m]), ys[m]) / args.micro
            else:
                with swap.backward(s, m):
                    losses.pop(m).backward()
        swap.end()
        if cuda:
            torch.cuda.synchronize()
        if step > 0:
            times.append(time.perf_counter() - t0)
            if cuda:
                peak = max(peak or 0, torch.cuda.max_memory_allocated())
    stats = swap.stats()
    return {
        "step_s": sorted(times)[len(times) // 2],
        "peak_allocated_bytes": peak,
        "peak_saved_bytes": stats["peak_saved_bytes"],
        "group_bytes": stats["max_group_bytes"],
        "groups_in_flight": stats["predicted_peak_groups"],
        "moved_bytes_per_step": stats["offloaded_bytes"] // (args.steps + 1),
        "grads": [p.grad.detach().clone() for p in model.parameters()],
    }


def simulate(args, binary):
    """The simulator's rank 0 for the same shape: the model as the first of --stages equal stages."""
    scenario = {
        "model": {
            "name": "examples/torch/gpt.py",
            "layers": args.layers * args.stages,
            "hidden": args.dim,
            "ffn_hidden": 4 * args.dim,
            "heads": args.heads,
            "kv_heads": args.heads,
            "vocab": args.vocab,
            "seq_len": args.seq,
            "micro_batch_size": args.batch,
            "mlp": "gelu",
            "param_dtype": "BF16" if args.dtype == "bfloat16" else "F32",
            "fp32_master": args.dtype == "bfloat16",
            "flash_attention": True,
        },
        "pipeline": {
            "schedule": args.schedule if args.schedule == "1f1b" else "gpipe",
            "ranks": args.stages,
            "micro_batches": args.micro,
        },
    }
    if args.device.startswith("cuda"):  # the simulator's device defaults, with this device's memory
        props = torch.cuda.get_device_properties(torch.device(args.device))
        scenario["device"] = {"name": props.name, "memory_bytes": props.total_memory}
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(scenario, f)
    try:
        r = subprocess.run(
            [binary, "simulate", "--scenario", f.name, "--json", "--svg", "", "--trace", ""],
            capture_output=True,
            text=True,
        )
    finally:
        os.unlink(f.name)
    if r.returncode != 0:
        return {"error": (r.stderr or r.stdout).strip()[-500:]}
    rep = json.loads(r.stdout)
    conf = {c["name"]: c["ranks"][0] for c in rep["configurations"]}
    none, act = conf.get("none"), conf.get("activations")
    if none is None or act is None:
        return {"error": f"configurations {sorted(conf)}"}
    return {
        "peak_bytes_without": none["peak_bytes"],
        "peak_bytes_with": act["peak_bytes"],
        "step_ratio": act["step_ns"] / none["step_ns"],
        "d2h_bytes": act["d2h_bytes"],
        "swapped_chunks": act["swapped_chunks"],
    }


def gib(n):
    return "n/a" if n is None else f"{n / 2**30:.3f} GiB"


def main():
    args = parse()
    args.dtype = args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32")
    params = parameter_count(args.vocab, args.dim, args.layers)
    base, swap = run(args, False), run(args, True)
    same = all(
        torch.equal(
            a.view(torch.int16 if a.element_size() == 2 else torch.int32),
            b.view(torch.int16 if b.element_size() == 2 else torch.int32),
        )
        for a, b in zip(base.pop("grads"), swap.pop("grads"))
    )
    print(
        f"model: {params / 1e6:.1f} M parameters ({args.dtype}), {args.micro} micro-batches of "
        f"{args.batch}x{args.seq} tokens, rank 0's order of {args.schedule} over {args.stages} stages, "
        f"on {args.device}"
    )
    print(f"{'':24}{'no offload':>16}{'offload':>16}")
    print(f"{'peak allocated':24}{gib(base['peak_allocated_bytes']):>16}{gib(swap['peak_allocated_bytes']):>16}")
    print(f"{'peak saved activations':24}{gib(base['peak_saved_bytes']):>16}{gib(swap['peak_saved_bytes']):>16}")
    print(f"{'groups in flight':24}{base['groups_in_flight']:>16}{swap['groups_in_flight']:>16}")
    print(f"{'moved per step':24}{gib(0):>16}{gib(swap['moved_bytes_per_step']):>16}")
    print(f"{'step':24}{base['step_s'] * 1e3:>13.1f} ms{swap['step_s'] * 1e3:>13.1f} ms")
    print(
        f"group: {gib(swap['group_bytes'])}; step-time ratio {swap['step_s'] / base['step_s']:.3f}; "
        f"gradients bit-identical: {'yes' if same else 'NO'}"
    )
    out = {
        "args": vars(args),
        "parameters": params,
        "no_offload": base,
        "offload": swap,
        "step_ratio": swap["step_s"] / base["step_s"],
        "bit_identical": same,
    }
    if args.simulate:
        sim = simulate(args, args.simulate)
        out["simulated"] = sim
        if "error" in sim:
            print(f"pipeswap simulate: {sim['error']}")
        else:
            print(
                f"pipeswap simulate, rank 0 of {args.stages}: peak {gib(sim['peak_bytes_without'])} -> "
                f"{gib(sim['peak_bytes_with'])}, step-time ratio {sim['step_ratio']:.3f}, "
                f"{sim['swapped_chunks']} groups swapped"
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
