"""One rank of the FSDP2 check of SwapAdamW, started by torchrun on the gloo backend (CPU).
tests/python/test_fsdp.py runs it with 2 and 4 processes.

What the rank does, in this order:

  PIPESWAP_TEST_CASES (default: all) for each case (1-D mesh; reshard_after_forward False with a MixedPrecisionPolicy;
           gradient accumulation with set_requires_gradient_sync and clip_grad_norm_ on the DTensor
           gradients; a 2-D mesh with HSDP; FSDP + TP on a 2-D mesh), the same model trains a few
           steps twice from the same seed under the same FSDP2 setup: with torch.optim.AdamW and with
           SwapAdamW. Every local shard of every parameter and every state tensor must be bit for bit
           the same after every step, the host store must hold exactly the local shards' state, and
           opt.state must show DTensors like torch's.
  PIPESWAP_TEST_DCP=dir  the DCP round trips: get/set_optimizer_state_dict (nested, flattened,
           full + cpu_offload) into a fresh SwapAdamW, dcp.save/dcp.load of model and optimizer
           (flattened, torchtitan's setting) through dir, each followed by steps that must match the
           uninterrupted run.
  PIPESWAP_TEST_ZERO=dir  ZeroRedundancyOptimizer(optimizer_class=SwapAdamW) and the same with
           torch's AdamW: 3 steps, consolidate_state_dict, save, a fresh ZeRO loads it, 3 more steps;
           parameters and the consolidated state must match bit for bit.
  PIPESWAP_TEST_SAVE=dir  trains STEPS_BEFORE steps with SwapAdamW (1-D mesh; HSDP on 4 ranks),
           saves model and optimizer with dcp.save into dir, and exits without any cleanup (a
           killed job).
  PIPESWAP_TEST_RESUME=dir  a fresh process: builds that job, loads the checkpoint, trains 10 more
           steps, and compares every parameter and state shard with an uninterrupted
           torch.optim.AdamW run of STEPS_BEFORE + 10 steps.

Prints "OK rank R: ..." lines and exits 0, or raises. A watchdog (faulthandler) dumps every
thread's stack and exits if the rank runs longer than PIPESWAP_TEST_WATCHDOG seconds (default
240): it says who waited on what.
"""

import copy
import faulthandler
import os
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

import pipeswap.torch as pt

STEPS_BEFORE = 3  # steps before the checkpoint of the save/resume phases
SWAP = dict(swap_times=3, min_swap_numel=16)
HYPER = dict(lr=0.02, betas=(0.9, 0.95), weight_decay=0.1)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.l1 = nn.Linear(16, 32)
        self.l2 = nn.Linear(32, 32)
        self.l3 = nn.Linear(32, 7)  # 7 rows: uneven shards, one rank may hold fewer

    def forward(self, x):
        return self.l3(torch.relu(self.l2(torch.relu(self.l1(x)))))


def build(case, world):
    torch.manual_seed(0)
    m = Net()
    kw = {}
    if case == "1d":
        mesh = init_device_mesh("cpu", (world,))
    elif case == "mp_keep":
        mesh = init_device_mesh("cpu", (world,))
        kw = dict(
            reshard_after_forward=False,
            mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32),
        )
    elif case == "accum_clip":
        mesh = init_device_mesh("cpu", (world,))
    elif case == "hsdp":
        mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("replicate", "shard"))
    elif case == "fsdp_tp":
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        mesh2 = init_device_mesh("cpu", (world // 2, 2), mesh_dim_names=("dp", "tp"))
        parallelize_module(m, mesh2["tp"], {"l1": ColwiseParallel(), "l2": RowwiseParallel()})
        mesh = mesh2["dp"]
    else:
        raise ValueError(case)
    for layer in (m.l1, m.l2, m.l3):
        fully_shard(layer, mesh=mesh, **kw)
    fully_shard(m, mesh=mesh, **kw)
    return m


def batch(step, micro=0):
    g = torch.Generator().manual_seed(1000 * step + 10 * dist.get_rank() + micro)
    return torch.randn(4, 16, generator=g)


def train_step(m, opt, step, case):
    if case == "accum_clip":
        m.set_requires_gradient_sync(False)
        m(batch(step, 0)).square().mean().backward()
        m.set_requires_gradient_sync(True)
        m(batch(step, 1)).square().mean().backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 0.05)
    else:
        m(batch(step)).square().mean().backward()
    opt.step()
    opt.zero_grad()


def bits(t):
    t = t.to_local() if isinstance(t, DTensor) else t
    t = t.detach().cpu().contiguous()
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def same(a, b, what):
    if isinstance(a, DTensor) != isinstance(b, DTensor):
        raise AssertionError(f"{what}: {type(a).__name__} against {type(b).__name__}")
    if isinstance(a, DTensor) and (a.placements != b.placements or a.shape != b.shape):
        raise AssertionError(f"{what}: {a.placements} {tuple(a.shape)} against {b.placements} {tuple(b.shape)}")
    x, y = bits(a), bits(b)
    if x.shape != y.shape or not torch.equal(x, y):
        raise AssertionError(f"rank {dist.get_rank()}: {what} differs")


def compare(m_ref, ref, m, opt, what):
    n = 0
    for (name, p), q in zip(m_ref.named_parameters(), m.parameters()):
        same(p, q, f"{what}: {name}")
        rs, ss = ref.state[p], opt.state[q]
        assert list(ss) == list(rs), (what, name, list(ss), list(rs))
        for k in rs:
            same(rs[k], ss[k], f"{what}: state of {name}, {k}")
        n += 1 + len(rs)
    return n


def local_state_bytes(m, opt):
    n = 0
    for p in m.parameters():
        local = p.to_local()
        if local.numel() >= SWAP["min_swap_numel"]:
            n += 2 * local.numel() * local.element_size()
    return n


def check_case(case, world, steps=3):
    m_ref, m = build(case, world), build(case, world)
    ref = torch.optim.AdamW(m_ref.parameters(), **HYPER)
    opt = pt.SwapAdamW(m.parameters(), **HYPER, **SWAP)
    compared = 0
    for step in range(steps):
        train_step(m_ref, ref, step, case)
        train_step(m, opt, step, case)
        compared += compare(m_ref, ref, m, opt, f"{case} step {step}")
    host = opt.swap_stats()["host_store_bytes"]
    want = local_state_bytes(m, opt)
    assert host == want, f"{case}: host store {host} bytes, the local shards' state {want}"
    for p in m.parameters():
        ea = opt.state[p]["exp_avg"]
        assert isinstance(ea, DTensor) and ea.placements == p.placements and ea.shape == p.shape, (case, ea)
    if case == "mp_keep":
        # FSDP2 computes in bf16 but keeps the sharded parameters in fp32, and torch's AdamW updates
        # them in place with no master beside them: what the simulator counts for parallel.fsdp
        # (sim/model.hpp, held_weight_bytes and optimizer_state_bytes_per_element).
        for p in m_ref.parameters():
            assert p.to_local().dtype == torch.float32, (case, p.dtype)
            assert sorted(ref.state[p]) == ["exp_avg", "exp_avg_sq", "step"], (case, sorted(ref.state[p]))
    return m_ref, ref, m, opt, compared


def fresh(case, world):
    m = build(case, world)
    return m, pt.SwapAdamW(m.parameters(), **HYPER, **SWAP)


def continue_and_compare(m_ref, ref, m, opt, case, start, steps, what):
    n = 0
    for step in range(start, start + steps):
        train_step(m_ref, ref, step, case)
        train_step(m, opt, step, case)
        n += compare(m_ref, ref, m, opt, f"{what} step {step}")
    return n


def check_dcp(world, ckpt):
    case = "1d"
    m_ref, ref, m, opt, _ = check_case(case, world, steps=2)
    results = []
    # get/set_optimizer_state_dict into a fresh optimizer, three ways.
    # (A full state dict with cpu_offload is rank 0's alone: it is broadcast from there at set.)
    for label, options, set_options in (
        ("nested", StateDictOptions(), None),
        ("flattened", StateDictOptions(flatten_optimizer_state_dict=True), None),
        (
            "full_cpu_offload",
            StateDictOptions(full_state_dict=True, cpu_offload=True),
            StateDictOptions(full_state_dict=True, cpu_offload=True, broadcast_from_rank0=True),
        ),
    ):
        msd = get_model_state_dict(m, options=options)
        osd = get_optimizer_state_dict(m, opt, options=options)
        m2, opt2 = fresh(case, world)
        set_model_state_dict(m2, msd, options=set_options or options)
        set_optimizer_state_dict(m2, opt2, osd, options=set_options or options)
        assert opt2.param_groups[0]["betas"] == HYPER["betas"] and isinstance(opt2.param_groups[0]["betas"], tuple)
        compare(m_ref, ref, m2, opt2, f"dcp {label} after load")
        results.append((label, m2, opt2))
    # dcp.save / dcp.load of model and optimizer, flattened (torchtitan's setting), into fresh ones.
    options = StateDictOptions(flatten_optimizer_state_dict=True)
    dcp.save(
        {"model": get_model_state_dict(m, options=options), "optim": get_optimizer_state_dict(m, opt, options=options)},
        checkpoint_id=ckpt,
    )
    m3, opt3 = fresh(case, world)
    sd = {
        "model": get_model_state_dict(m3, options=options),
        "optim": get_optimizer_state_dict(m3, opt3, options=options),
    }
    dcp.load(sd, checkpoint_id=ckpt)
    set_model_state_dict(m3, sd["model"], options=options)
    set_optimizer_state_dict(m3, opt3, sd["optim"], options=options)
    compare(m_ref, ref, m3, opt3, "dcp.load after load")
    results.append(("dcp.save/load", m3, opt3))
    # Every restored optimizer continues exactly as the uninterrupted one (3 more steps each).
    n = 0
    for label, m2, opt2 in results:
        mr, rr = build(case, world), None
        mr.load_state_dict(m_ref.state_dict())
        rr = torch.optim.AdamW(mr.parameters(), **HYPER)
        rr.load_state_dict(copy.deepcopy(ref.state_dict()))  # torch's load may alias the tensors
        n += continue_and_compare(mr, rr, m2, opt2, case, 2, 3, f"resumed {label}")
    return n


def check_zero(tmp):
    """ZeroRedundancyOptimizer(optimizer_class=SwapAdamW) against the same with torch's AdamW:
    3 steps, consolidate_state_dict, a fresh ZeRO loads the consolidated state, 3 more steps."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    def run(cls, extra):
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 7))
        zero = ZeroRedundancyOptimizer(m.parameters(), optimizer_class=cls, **HYPER, **extra)

        def steps(z, start):
            for step in range(start, start + 3):
                g = torch.Generator().manual_seed(step)  # the same data on every rank: no all-reduce needed
                z.zero_grad()
                m(torch.randn(4, 16, generator=g)).square().mean().backward()
                z.step()

        steps(zero, 0)
        zero.consolidate_state_dict(to=0)
        path = os.path.join(tmp, f"zero-{cls.__name__}.pt")
        if dist.get_rank() == 0:
            torch.save(zero.state_dict(), path)
        dist.barrier()
        torch.manual_seed(1)
        m2 = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 7))
        m2.load_state_dict(m.state_dict())
        m = m2
        zero = ZeroRedundancyOptimizer(m.parameters(), optimizer_class=cls, **HYPER, **extra)
        zero.load_state_dict(torch.load(path, weights_only=False))
        steps(zero, 3)
        zero.consolidate_state_dict(to=0)
        return m, (zero.state_dict() if dist.get_rank() == 0 else None)

    m_ref, sd_ref = run(torch.optim.AdamW, {})
    m, sd = run(pt.SwapAdamW, SWAP)
    n = 0
    for (name, p), q in zip(m_ref.named_parameters(), m.parameters()):
        same(p, q, f"zero: {name}")
        n += 1
    if sd is not None:
        for i, st in sd_ref["state"].items():
            for k, v in st.items():
                same(v, sd["state"][i][k], f"zero: state[{i}][{k}]")
                n += 1
    return n


def main():
    faulthandler.enable()  # a fatal signal dumps the stacks too
    faulthandler.dump_traceback_later(float(os.environ.get("PIPESWAP_TEST_WATCHDOG", "240")), exit=True)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    case = "hsdp" if world >= 4 else "1d"  # the job of the save/resume phases
    env = os.environ.get
    for c in filter(None, env("PIPESWAP_TEST_CASES", "1d,mp_keep,accum_clip,hsdp,fsdp_tp").split(",")):
        _, _, _, _, n = check_case(c, world)
        print(f"OK rank {rank}: {c}: {n} tensors bit-identical", flush=True)
    if env("PIPESWAP_TEST_DCP"):
        n = check_dcp(world, env("PIPESWAP_TEST_DCP"))
        print(f"OK rank {rank}: dcp: {n} tensors bit-identical", flush=True)
    if env("PIPESWAP_TEST_ZERO"):
        n = check_zero(env("PIPESWAP_TEST_ZERO"))
        print(f"OK rank {rank}: zero: {n} tensors bit-identical", flush=True)
    if env("PIPESWAP_TEST_SAVE"):
        m, opt = fresh(case, world)
        for step in range(STEPS_BEFORE):
            train_step(m, opt, step, case)
        options = StateDictOptions(flatten_optimizer_state_dict=True)
        dcp.save(
            {
                "model": get_model_state_dict(m, options=options),
                "optim": get_optimizer_state_dict(m, opt, options=options),
            },
            checkpoint_id=env("PIPESWAP_TEST_SAVE"),
        )
        dist.barrier()
        print(f"OK rank {rank}: saved after {STEPS_BEFORE} steps", flush=True)
        os._exit(0)  # killed: no cleanup of any kind
    if env("PIPESWAP_TEST_RESUME"):
        m, opt = fresh(case, world)
        options = StateDictOptions(flatten_optimizer_state_dict=True)
        sd = {
            "model": get_model_state_dict(m, options=options),
            "optim": get_optimizer_state_dict(m, opt, options=options),
        }
        dcp.load(sd, checkpoint_id=env("PIPESWAP_TEST_RESUME"))
        set_model_state_dict(m, sd["model"], options=options)
        set_optimizer_state_dict(m, opt, sd["optim"], options=options)
        m_ref = build(case, world)
        ref = torch.optim.AdamW(m_ref.parameters(), **HYPER)
        for step in range(STEPS_BEFORE):
            train_step(m_ref, ref, step, case)
        n = continue_and_compare(m_ref, ref, m, opt, case, STEPS_BEFORE, 10, "resumed")
        print(f"OK rank {rank}: resumed: {n} tensors bit-identical over 10 steps", flush=True)
    dist.barrier()  # no rank tears gloo down while another still talks to it
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
