"""One rank of the activation-swap pipeline check, started by torchrun on the gloo backend (the
device is CPU memory, so every offload and load is a real copy). tests/python/test_pipeline_dist.py
runs it with 2, 3 and 4 processes.

For each schedule (GPipe, 1F1B, interleaved 1F1B with two stages per rank; the placement's default,
a load lookahead of 2, and that with an offload wait delay of 2), each micro-batch count
and each optimizer (torch.optim.AdamW, pipeswap.torch.SwapAdamW), a small transformer trains a few
steps twice, from the same seed: without activation swap, and with offload_activations. Every
gradient of every step and every parameter after the last must be bit for bit the same. With swap
on, before every SWAP_LAUNCH_LOAD no storage an offload moved may still be referenced anywhere, the
step's peak of swappable saved bytes must stay within what the injected order predicts, and the
groups the order swaps must have moved storages.

PIPESWAP_TEST_EVAL=1 checks evaluation instead: for each schedule, ``schedule.eval()`` under
``torch.no_grad()`` and with grad enabled, between training steps, on a schedule with
offload_activations and on the same schedule without: the losses and outputs are bit for bit the
same, evaluation runs no swap step and moves nothing, and the training steps around it still match.

PIPESWAP_TEST_FAIL=rank:micro makes that rank's stage raise in the forward of that micro-batch (the
failure test); the rank's error must name it, and torchrun must take the job down.

Prints "OK rank R: ..." and exits 0, or raises. A watchdog (faulthandler) dumps every thread's stack
and exits if the rank waits longer than PIPESWAP_TEST_WATCHDOG seconds (default 240): it says who
waited on what.
"""

import contextlib
import faulthandler
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "..", "..", "examples", "torch"))
from gpt import gpt_stages, loss_fn  # noqa: E402

import pipeswap.torch as pt  # noqa: E402
from pipeswap.torch.pipelining import offload_activations  # noqa: E402

VOCAB, DIM, HEADS, SEQ, BATCH = 64, 32, 4, 16, 2
STEPS = 2
SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B, "interleaved_1f1b": ScheduleInterleaved1F1B}
# (load_lookahead, offload_wait_delay) per schedule: the default placement and both options
PLACEMENT = {"gpipe": (1, 1), "1f1b": (2, 1), "interleaved_1f1b": (2, 2)}


def fail_at(stage, micro):
    """Makes the stage's forward of `micro` raise (installed below pipeswap's instrumentation)."""
    forward = stage.forward_one_chunk

    def failing(fwd_chunk_id, *args, **kwargs):
        if fwd_chunk_id == micro:
            raise ValueError("injected failure")
        return forward(fwd_chunk_id, *args, **kwargs)

    stage.forward_one_chunk = failing


def micro_counts(kind, world):
    if kind == "interleaved_1f1b":
        return [world, 2 * world]
    return [world, 2 * world + 1]


def run(kind, micro, opt_kind, offload, rank, world, fail=None):
    stages_per_rank = 2 if kind == "interleaved_1f1b" else 1
    n_stages = world * stages_per_rank
    modules = gpt_stages(VOCAB, DIM, layers=n_stages, heads=HEADS, stages=n_stages, seed=1234)
    mine = [s for s in range(n_stages) if s % world == rank]
    stages = []
    for s in mine:
        stages.append(PipelineStage(modules[s], s, n_stages, torch.device("cpu")))
        if fail is not None and fail[0] == rank and s == mine[0]:
            fail_at(stages[-1], fail[1])
    params = [p for s in mine for p in modules[s].parameters()]
    opt = pt.SwapAdamW(params, lr=1e-2, swap_times=2) if opt_kind == "swapadamw" else torch.optim.AdamW(params, lr=1e-2)
    cls = SCHEDULES[kind]
    schedule = cls(stages if stages_per_rank > 1 else stages[0], n_microbatches=micro, loss_fn=loss_fn)

    checks = {"before_load": 0, "moved_groups": 0}
    swap = None
    if offload:

        def on_swap_step(k, s, m):
            if k == "SWAP_LAUNCH_LOAD":
                alive = swap.stats()["moved_alive"]
                if alive:
                    raise AssertionError(
                        f"rank {rank}: {alive} moved storages still referenced before the load of ({s}, {m})"
                    )
                checks["before_load"] += 1
                checks["moved_groups"] += swap.moved_storages(s, m) > 0

        lookahead, delay = PLACEMENT[kind]
        swap = offload_activations(
            schedule, min_bytes=0, load_lookahead=lookahead, offload_wait_delay=delay, on_swap_step=on_swap_step
        )
        swapped = {(e[1], e[2]) for e in swap.order if e is not None and e[0] == "SWAP_LAUNCH_OFFLOAD"}

    g = torch.Generator().manual_seed(99)
    grads = []
    for _ in range(STEPS):
        x = torch.randint(0, VOCAB, (BATCH * micro, SEQ), generator=g)
        y = torch.randint(0, VOCAB, (BATCH * micro, SEQ), generator=g)
        opt.zero_grad()
        args = (x,) if 0 in mine else ()
        kwargs = {"target": y} if n_stages - 1 in mine else {}
        schedule.step(*args, **kwargs)
        grads.append([p.grad.clone() for p in params])
        opt.step()
        if offload:
            st = swap.stats()
            bound = st["predicted_peak_groups"] * st["max_group_bytes"]
            if st["peak_saved_bytes"] > bound:
                raise AssertionError(
                    f"rank {rank} {kind} M={micro}: peak swappable saved bytes "
                    f"{st['peak_saved_bytes']} exceed the order's {st['predicted_peak_groups']} "
                    f"groups x {st['max_group_bytes']} bytes"
                )
            if checks["before_load"] != len(swapped) or checks["moved_groups"] != len(swapped):
                raise AssertionError(
                    f"rank {rank} {kind} M={micro}: {len(swapped)} groups swapped by the order, "
                    f"{checks['before_load']} loads checked, {checks['moved_groups']} moved "
                    "storages"
                )
            checks.update(before_load=0, moved_groups=0)
            plain = [e for e in swap.order if e is None or not e[0].startswith("SWAP_")]
            without = pt.ActivationSwap("cpu", plain, offload=False).predicted_peak_groups()
            # Never more than without offload; with GPipe (every forward before every backward) fewer.
            if st["predicted_peak_groups"] > without or (
                kind == "gpipe" and swapped and not st["predicted_peak_groups"] < without
            ):
                raise AssertionError(
                    f"rank {rank} {kind} M={micro}: {st['predicted_peak_groups']} groups in flight "
                    f"with offload, {without} without"
                )
    if offload and swap.order_source != "pipeswap":
        raise AssertionError(f"rank {rank} {kind} M={micro}: torch runs another order than pipeswap's {kind}")
    return grads, [p.detach().clone() for p in params], (len(swapped) if offload else 0)


def check_eval(kind, rank, world):
    """Evaluation between two training steps, with and without offload_activations (see above)."""
    stages_per_rank = 2 if kind == "interleaved_1f1b" else 1
    n_stages, micro = world * stages_per_rank, 2 * world
    results, counted, swaps, steps = [], 0, False, []  # steps: the swap steps run (the offloaded schedule's)
    for offload in (False, True):
        modules = gpt_stages(VOCAB, DIM, layers=n_stages, heads=HEADS, stages=n_stages, seed=1234)
        mine = [s for s in range(n_stages) if s % world == rank]
        stages = [PipelineStage(modules[s], s, n_stages, torch.device("cpu")) for s in mine]
        schedule = SCHEDULES[kind](stages if stages_per_rank > 1 else stages[0], n_microbatches=micro, loss_fn=loss_fn)
        swap = offload_activations(schedule, min_bytes=0, on_swap_step=lambda *e: steps.append(e)) if offload else None
        g = torch.Generator().manual_seed(7)
        out = []
        for phase in ("train", "eval no_grad", "eval grad", "train"):
            x = torch.randint(0, VOCAB, (BATCH * micro, SEQ), generator=g)
            y = torch.randint(0, VOCAB, (BATCH * micro, SEQ), generator=g)
            args, kwargs = ((x,) if 0 in mine else ()), ({"target": y} if n_stages - 1 in mine else {})
            before = (len(steps), swap.stats()["offloaded_bytes"], swap.steps_run) if swap else None
            if phase == "train":
                for m in modules:
                    m.zero_grad()
                schedule.step(*args, **kwargs)
                out.append([p.grad.clone() for s in mine for p in modules[s].parameters()])
                continue
            losses = []
            with torch.no_grad() if phase == "eval no_grad" else contextlib.nullcontext():
                merged = schedule.eval(*args, losses=losses, **kwargs)
            out.append([t.detach().clone() for t in losses] + ([merged.detach().clone()] if merged is not None else []))
            if swap and (len(steps), swap.stats()["offloaded_bytes"], swap.steps_run) != before:
                raise AssertionError(
                    f"rank {rank} {kind}: {phase} ran {len(steps) - before[0]} swap steps and "
                    f"moved {swap.stats()['offloaded_bytes'] - before[1]} bytes"
                )
        if swap:
            counted = swap.stats()["offloaded_bytes"]
            swaps = any(e is not None and e[0] == "SWAP_LAUNCH_OFFLOAD" for e in swap.order)
        results.append(out)
    if swaps != (counted > 0):  # 1F1B on two ranks swaps nothing (too close); the others do
        raise AssertionError(
            f"rank {rank} {kind}: the order swaps {'some' if swaps else 'no'} groups, the "
            f"training steps moved {counted} bytes"
        )
    n = 0
    for i, (a, b) in enumerate(zip(*results)):
        if len(a) != len(b) or (i in (1, 2) and n_stages - 1 in mine and not a):
            raise AssertionError(f"rank {rank} {kind}: phase {i} gave {len(a)} and {len(b)} tensors")
        for u, v in zip(a, b):
            if not torch.equal(
                u.view(torch.int32) if u.dtype == torch.float32 else u,
                v.view(torch.int32) if v.dtype == torch.float32 else v,
            ):
                raise AssertionError(f"rank {rank} {kind}: phase {i} differs with offload_activations")
            n += 1
    return n


def main():
    faulthandler.dump_traceback_later(float(os.environ.get("PIPESWAP_TEST_WATCHDOG", "240")), exit=True)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    if os.environ.get("PIPESWAP_TEST_EVAL"):
        n = sum(check_eval(kind, rank, world) for kind in SCHEDULES)
        dist.barrier()
        print(f"OK rank {rank}: evaluation, {n} tensors bit-identical", flush=True)
        dist.destroy_process_group()
        return
    fail = os.environ.get("PIPESWAP_TEST_FAIL")
    if fail:
        r, m = (int(v) for v in fail.split(":"))
        run("1f1b", 2 * world, "adamw", True, rank, world, fail=(r, m))
        raise AssertionError("the injected failure did not fail the step")

    compared = swapped_groups = 0
    for kind in SCHEDULES:
        for micro in micro_counts(kind, world):
            for opt_kind in ("adamw", "swapadamw"):
                g0, p0, _ = run(kind, micro, opt_kind, False, rank, world)
                g1, p1, n = run(kind, micro, opt_kind, True, rank, world)
                swapped_groups += n
                for step, (a, b) in enumerate(zip(g0, g1)):
                    for i, (u, v) in enumerate(zip(a, b)):
                        if not torch.equal(u.view(torch.int32), v.view(torch.int32)):
                            raise AssertionError(
                                f"rank {rank} {kind} M={micro} {opt_kind}: gradient {i} of step "
                                f"{step} differs with activation swap"
                            )
                        compared += 1
                for i, (u, v) in enumerate(zip(p0, p1)):
                    if not torch.equal(u.view(torch.int32), v.view(torch.int32)):
                        raise AssertionError(
                            f"rank {rank} {kind} M={micro} {opt_kind}: parameter {i} differs with activation swap"
                        )
                    compared += 1
    dist.barrier()
    print(f"OK rank {rank}: {compared} tensors bit-identical, {swapped_groups} groups swapped", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
