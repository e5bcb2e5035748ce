"""SwapAdamW where frameworks look at a torch optimizer: step hooks, ``optimizer.state`` (read,
written, moved, cleared), state dicts without a second copy, DCP's flattened format, parameters
replaced in param_groups, torch.compile, and host memory that stays flat over 100 steps. torch's
AdamW doing the same is the oracle throughout."""

import gc
import resource
import weakref

import pytest
import torch
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from conftest import DEVICE, assert_same_bits, assert_same_state
from pipeswap.torch import DeviceBudget, SwapAdamW

KW = dict(lr=0.01, betas=(0.9, 0.95), weight_decay=0.1)


def model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 32), torch.nn.GELU(),
                               torch.nn.Linear(32, 4)).to(DEVICE)


def pair(seed=0, **swap):
    m, ref_m = model(seed), model(seed)
    opt = SwapAdamW(m.parameters(), **KW, **{"swap_times": 3, "min_swap_numel": 8, **swap})
    ref = torch.optim.AdamW(ref_m.parameters(), **KW)
    return m, opt, ref_m, ref


def train(m, opt, steps, start=0):
    for step in range(start, start + steps):
        g = torch.Generator().manual_seed(step)
        x = torch.randn(8, 16, generator=g).to(DEVICE)
        opt.zero_grad()
        m(x).square().mean().backward()
        opt.step()


def same(m, opt, ref_m, ref, what=""):
    for k, (a, b) in enumerate(zip(m.parameters(), ref_m.parameters())):
        assert_same_bits(a, b, f"{what}param {k}")
    assert_same_state(opt.state_dict(), ref.state_dict(), what)


def test_step_hooks_fire_once_per_step():
    m, opt, _, _ = pair(swap_times=5)
    calls = []
    handles = [register_optimizer_step_pre_hook(lambda o, a, k: calls.append(("global pre", o))),
               register_optimizer_step_post_hook(lambda o, a, k: calls.append(("global post", o))),
               opt.register_step_pre_hook(lambda o, a, k: calls.append(("pre", o))),
               opt.register_step_post_hook(lambda o, a, k: calls.append(("post", o)))]
    try:
        train(m, opt, 3)
    finally:
        for h in handles:
            h.remove()
    assert opt.swap_stats()["batches"] == 5
    assert [c for c, _ in calls] == ["global pre", "pre", "post", "global post"] * 3
    assert all(o is opt for _, o in calls)


def test_state_shows_torchs_keys_as_views_of_the_host_store():
    m, opt, ref_m, ref = pair()
    assert len(opt.state) == 0 and not opt.state
    train(m, opt, 2)
    train(ref_m, ref, 2)
    assert len(opt.state) == len(ref.state) == 6
    sd = opt.state_dict()
    for n, (p, q) in enumerate(zip(m.parameters(), ref_m.parameters())):
        s, r = opt.state[p], ref.state[q]
        assert list(s) == list(r) == ["step", "exp_avg", "exp_avg_sq"]
        for k in r:
            assert_same_bits(s[k], r[k], k)
        assert s["step"] is sd["state"][n]["step"]  # torch's step tensor itself, as torch hands it out
    # The state dict's moments are the same memory as opt.state's: no second copy of the state.
    for n, p in enumerate(m.parameters()):
        assert sd["state"][n]["exp_avg"].data_ptr() == opt.state[p]["exp_avg"].data_ptr()
    with pytest.raises(KeyError, match="not a parameter of this optimizer"):
        opt.state[torch.zeros(3)]


@pytest.mark.parametrize("how", ["state.clear()", "del state[p]", "state[p].clear()", "state[p] = {}"])
def test_resetting_state_resets_like_torch(how):
    m, opt, ref_m, ref = pair()
    train(m, opt, 3)
    train(ref_m, ref, 3)
    for o, mm in ((opt, m), (ref, ref_m)):
        p = list(mm.parameters())[2]
        if how == "state.clear()":
            o.state.clear()
        elif how == "del state[p]":
            del o.state[p]
        elif how == "state[p].clear()":
            o.state[p].clear()
        else:
            o.state[p] = {}
    assert len(opt.state) == len(ref.state)
    train(m, opt, 3, start=10)
    train(ref_m, ref, 3, start=10)
    same(m, opt, ref_m, ref, f"after {how}: ")


def test_writes_to_state_reach_the_store():
    m, opt, ref_m, ref = pair()
    train(m, opt, 2)
    train(ref_m, ref, 2)
    # A framework's device move (Lightning's _optimizer_to_device writes every tensor back).
    for p, v in opt.state.items():
        for k in list(v):
            if k != "step":
                v[k] = v[k].to(DEVICE, copy=True) * 1  # a new tensor, written into the store
    for o in (opt, ref):  # the same edit on both
        for p in o.state:
            o.state[p]["exp_avg"] = o.state[p]["exp_avg"] * 0.5
    # A whole entry written at once (ZeroRedundancyOptimizer's load does this).
    p, q = list(m.parameters())[0], list(ref_m.parameters())[0]
    ref.state[q] = {k: v.clone() for k, v in ref.state[q].items()}
    opt.state[p] = {k: v.clone() for k, v in ref.state[q].items()}
    train(m, opt, 3, start=5)
    train(ref_m, ref, 3, start=5)
    same(m, opt, ref_m, ref, "after writes: ")
    with pytest.raises(ValueError, match=r"shape"):
        opt.state[p]["exp_avg"] = torch.zeros(3)
    with pytest.raises(ValueError, match="needs"):
        opt.state[p] = {"step": torch.tensor(1.0)}
    with pytest.raises(KeyError, match="cannot be removed alone"):
        del opt.state[p]["exp_avg_sq"]
    train(m, opt, 1, start=9)  # still usable: nothing changed by the refused writes
    train(ref_m, ref, 1, start=9)
    same(m, opt, ref_m, ref, "after refused writes: ")


def test_held_views_survive_rebuilds_and_the_optimizer():
    m, opt, _, _ = pair()
    train(m, opt, 2)
    sd = opt.state_dict()
    view = opt.state[next(iter(m.parameters()))]["exp_avg_sq"]
    before = [t.clone() for t in (sd["state"][0]["exp_avg"], view)]
    opt.add_param_group({"params": [torch.zeros(64, 8, device=DEVICE, requires_grad=True)]})  # stores move
    train(m, opt, 1, start=3)
    assert torch.equal(sd["state"][0]["exp_avg"], before[0]) and torch.equal(view, before[1])
    sd2 = opt.state_dict()
    gone = weakref.ref(opt)
    del opt
    assert gone() is None  # no reference cycle: the stores go with the last reference, not at a GC
    _ = [torch.zeros(1 << 16) for _ in range(8)]  # reuse freed memory, if anything was freed under a view
    assert torch.isfinite(sd2["state"][0]["exp_avg"]).all()
    assert torch.equal(view, before[1])


def test_flattened_dcp_state_dict_round_trips():
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_optimizer_state_dict,
                                                         set_optimizer_state_dict)
    m, opt, ref_m, ref = pair()
    train(m, opt, 2)
    train(ref_m, ref, 2)
    options = StateDictOptions(flatten_optimizer_state_dict=True)
    flat = get_optimizer_state_dict(m, opt, options=options)
    assert flat["param_groups.0.weight.betas"] == (0.9, 0.95)
    assert set(flat) == set(get_optimizer_state_dict(ref_m, ref, options=options))
    assert flat["state.0.weight.exp_avg"].data_ptr() == opt.state[m[0].weight]["exp_avg"].data_ptr()
    m2 = model(7)
    m2.load_state_dict(m.state_dict())
    opt2 = SwapAdamW(m2.parameters(), lr=0.5, swap_times=2, min_swap_numel=8)  # a fresh template
    set_optimizer_state_dict(m2, opt2, flat, options=options)
    assert opt2.param_groups[0]["betas"] == (0.9, 0.95) and type(opt2.param_groups[0]["betas"]) is tuple
    assert opt2.param_groups[0]["lr"] == 0.01
    train(m2, opt2, 3, start=2)
    train(ref_m, ref, 3, start=2)
    same(m2, opt2, ref_m, ref, "flattened round trip: ")


def test_parameters_replaced_before_the_first_step_are_bound_afresh():
    # accelerate swaps the parameters in param_groups for sharded ones after the optimizer exists.
    placeholders = [torch.zeros(4, 4, device=DEVICE, requires_grad=True) for _ in range(6)]
    m, ref_m = model(), model()
    opt = SwapAdamW(placeholders, **KW, swap_times=3, min_swap_numel=8)
    ref = torch.optim.AdamW(ref_m.parameters(), **KW)
    opt.param_groups[0]["params"] = list(m.parameters())
    train(m, opt, 3)
    train(ref_m, ref, 3)
    same(m, opt, ref_m, ref, "rebound: ")
    size = sum(p.numel() for p in m.parameters() if p.numel() >= 8) * 2 * 4
    assert opt.swap_stats()["host_store_bytes"] == size  # nothing left of the placeholders
    # Once the state exists, a parameter that would lose it is refused, and nothing changes.
    opt.param_groups[0]["params"] = placeholders
    with pytest.raises(RuntimeError, match="param_groups changed after the optimizer state was started"):
        train(m, opt, 1)
    opt.param_groups[0]["params"] = list(m.parameters())
    train(m, opt, 1, start=3)
    train(ref_m, ref, 1, start=3)
    same(m, opt, ref_m, ref, "after the refused change: ")
    # A parameter appended in place joins (with add_param_group's checks), as in torch.
    extra, ref_extra = (torch.ones(5, 7, device=DEVICE, requires_grad=True) for _ in range(2))
    opt.param_groups[0]["params"].append(extra)
    ref.param_groups[0]["params"].append(ref_extra)
    for o, mm, e in ((opt, m, extra), (ref, ref_m, ref_extra)):
        e.grad = torch.full_like(e, 0.5)
        mm(torch.ones(2, 16, device=DEVICE)).sum().backward()
        o.step()
    assert_same_bits(extra, ref_extra, "appended parameter")
    same(m, opt, ref_m, ref, "after an append: ")
    opt.param_groups[0]["params"].append(torch.zeros(8, 8, device=DEVICE).t()[::2].requires_grad_())
    with pytest.raises(ValueError, match=r"param_groups\[0\]\['params'\]\[7\].*not dense"):
        opt.step()


def test_param_names_stay_in_groups_and_state_dict():
    m, ref_m = model(), model()
    opt = SwapAdamW(m.named_parameters(), **KW, swap_times=2, min_swap_numel=8)
    ref = torch.optim.AdamW(ref_m.named_parameters(), **KW)
    train(m, opt, 2)
    train(ref_m, ref, 2)
    names = [n for n, _ in m.named_parameters()]
    assert opt.param_groups[0]["param_names"] == ref.param_groups[0]["param_names"] == names
    assert opt.state_dict()["param_groups"][0]["param_names"] == names
    same(m, opt, ref_m, ref, "named: ")
    opt2 = SwapAdamW(model(3).named_parameters(), **KW)
    opt2.load_state_dict(ref.state_dict())
    assert opt2.state_dict()["param_groups"][0]["param_names"] == names


def test_compiled_loop_runs_the_step_eagerly():
    # The step is excluded from tracing: compiling a loop that calls it compiles the rest and runs the
    # step as it runs eagerly (bits equal to the eager AdamW), never tracing into pipeswap.
    m, opt, ref_m, ref = pair()
    traced = []
    inner = opt._inner_step

    def spy(o):
        traced.append(torch.compiler.is_compiling())
        return inner(o)

    opt._inner_step = spy

    def loop(mm, o, x):
        o.zero_grad()
        mm(x).square().mean().backward()
        o.step()

    compiled = torch.compile(loop, backend="eager")
    for step in range(3):
        x = torch.randn(8, 16, generator=torch.Generator().manual_seed(step)).to(DEVICE)
        compiled(m, opt, x)
        loop(ref_m, ref, x)
    assert traced and not any(traced)
    same(m, opt, ref_m, ref, "compiled loop: ")


def test_compiled_model_trains_bit_identically_to_torch():
    m, opt, ref_m, ref = pair()
    cm, cref = torch.compile(m, backend="eager"), torch.compile(ref_m, backend="eager")
    train(cm, opt, 3)
    train(cref, ref, 3)
    same(m, opt, ref_m, ref, "compiled model: ")


def test_optimizers_on_one_device_share_one_budget():
    budget = DeviceBudget(DEVICE, 1 << 30)

    def two_optimizers():
        opts = []
        for seed in (1, 2):
            m, opt, _, _ = pair(seed, resident_share=1 << 20)
            train(m, opt, 1)
            opts.append(opt)
        return budget.stats(), [o.swap_stats()["resident_share_bytes"] for o in opts]

    try:
        stats, resident = two_optimizers()
        assert all(r > 0 for r in resident) and stats["used_optimizer"] >= sum(resident), (stats, resident)
    finally:
        gc.collect()
        budget.close()  # refused while an optimizer still held device storage counted in it


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def test_host_memory_is_allocated_once():
    torch.manual_seed(0)
    ps = [torch.randn(256, 256, device=DEVICE, requires_grad=True) for _ in range(4)]  # 2 MiB of state
    opt = SwapAdamW(ps, lr=1e-3, swap_times=4)
    gs = [torch.randn_like(p) for p in ps]

    def steps(n):
        for _ in range(n):
            for p, g in zip(ps, gs):
                p.grad = g
            opt.step()

    steps(10)
    stats, rss, faults = opt.swap_stats(), rss_bytes(), resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    steps(100)
    grown = rss_bytes() - rss
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    assert opt.swap_stats() == stats
    # A store or arena kept per step would grow by a batch per step (100 batches), one touched afresh
    # would fault every page of a batch per step. The C allocator settles once in a while (seen: 0 to
    # 512 KiB over 100 steps after 10), so the bounds are a tenth of those.
    batch = stats["max_batch_bytes"]
    assert grown < 10 * batch, f"resident memory grew by {grown} bytes over 100 steps (a batch: {batch})"
    assert faults < 100 * batch // resource.getpagesize() // 10, f"{faults} page faults in 100 steps"
