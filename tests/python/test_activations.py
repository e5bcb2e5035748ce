"""pipeswap.torch.ActivationSwap in one process: what moves and what stays, the order as a cursor,
errors, and the bits against the same run without swap.

A stage here is a small module run through one rank's order of a pipeline schedule (the other ranks'
work is absent: the loss is computed right away), so the saved tensors of several micro-batches are
alive at once, as on a pipeline's first stage.
"""

import contextlib
import json
import os
import pathlib
import re
import subprocess
import sys

import pytest
import torch
from conftest import DEVICE, assert_same_bits
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

import pipeswap.torch as pt


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a = torch.nn.Linear(16, 64)
        self.b = torch.nn.Linear(64, 16)
        self.norm = torch.nn.LayerNorm(16)

    def forward(self, x):
        return self.norm(self.b(torch.tanh(self.a(x))))


def compute(order):
    return [e for e in order if e is not None and e[0] in ("FWD", "BWD")]


def run(order, offload, net=None, xs=None, swap=None, **kw):
    """Trains one step of `order` (rank 0's stage 0); returns the gradients and the swap."""
    net = net or Net().to(DEVICE)
    xs = xs or [torch.randn(8, 16, generator=torch.Generator().manual_seed(m)).to(DEVICE) for m in range(16)]
    swap = swap or pt.ActivationSwap(DEVICE, order, offload=offload, min_bytes=kw.pop("min_bytes", 0), **kw)
    net.zero_grad()
    losses = {}
    for k, s, m in compute(order):
        if k == "FWD":
            with swap.forward(s, m):
                losses[m] = net(xs[m]).square().mean()
        else:
            with swap.backward(s, m):
                losses.pop(m).backward()
    swap.end()
    return [p.grad.clone() for p in net.parameters()], swap


ORDERS = {
    "gpipe": pt.schedule_orders("gpipe", 1, 8)[0],
    "1f1b": pt.schedule_orders("1f1b", 4, 8)[0],
    "interleaved": [e for e in pt.schedule_orders("interleaved_1f1b", 2, 4, 2)[0]],
}


def stage0(order):
    return [e for e in order if e is None or e[1] == 0]


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize("lookahead,delay", [(1, 1), (2, 1), (1, 3)])
def test_gradients_bit_identical_and_peak_within_the_order(name, lookahead, delay):
    order = ORDERS[name]
    g0, base = run(order, False)
    g1, swap = run(order, True, load_lookahead=lookahead, offload_wait_delay=delay)
    for i, (a, b) in enumerate(zip(g0, g1)):
        assert_same_bits(a, b, f"gradient {i}")
    st, st0 = swap.stats(), base.stats()
    assert st["offloaded_bytes"] > 0
    assert st["max_group_bytes"] == st0["max_group_bytes"] > 0
    assert st["peak_saved_bytes"] <= st["predicted_peak_groups"] * st["max_group_bytes"]
    assert st0["peak_saved_bytes"] == st0["predicted_peak_groups"] * st0["max_group_bytes"]
    assert st["peak_saved_bytes"] <= st0["peak_saved_bytes"]
    if (lookahead, delay) == (1, 1):  # the default placement holds fewer groups than no swap
        assert st["peak_saved_bytes"] < st0["peak_saved_bytes"]
    assert st["groups"] == 0 and st["saved_bytes"] == 0  # end() released everything


def test_gpipe_offload_keeps_few_groups_where_the_baseline_keeps_all():
    _, base = run(ORDERS["gpipe"], False)
    _, swap = run(ORDERS["gpipe"], True)
    assert base.stats()["predicted_peak_groups"] == 8
    assert swap.stats()["predicted_peak_groups"] <= 3


def test_moved_storages_are_released_before_their_load():
    seen = []

    def check(kind, stage, micro):
        if kind == "SWAP_LAUNCH_LOAD":
            seen.append(
                (swap.group_state(stage, micro), swap.stats()["moved_alive"], swap.moved_storages(stage, micro))
            )

    swap = pt.ActivationSwap(DEVICE, ORDERS["gpipe"], min_bytes=0, on_swap_step=check)
    run(ORDERS["gpipe"], True, swap=swap)
    assert len(seen) == 8  # GPipe on one rank: every backward trails its forward by 8 compute slots
    for state, alive, moved in seen:
        assert state == "offloaded" and alive == 0 and moved > 0


def test_a_tensor_held_elsewhere_stays_and_is_not_released():
    held = []

    class Holding(Net):
        def forward(self, x):
            h = torch.tanh(self.a(x))
            held.append(h)  # the user keeps the activation: moving it would free nothing
            return self.norm(self.b(h))

    torch.manual_seed(0)
    net = Holding().to(DEVICE)
    seen = []
    swap = pt.ActivationSwap(
        DEVICE, ORDERS["gpipe"], min_bytes=0, on_swap_step=lambda k, s, m: seen.append(swap.stats()["moved_alive"])
    )
    g1, _ = run(ORDERS["gpipe"], True, net=net, swap=swap)
    g0, _ = run(ORDERS["gpipe"], False, net=Net().to(DEVICE))
    for a, b in zip(g0, g1):
        assert_same_bits(a, b, "gradient")
    assert set(seen) == {0}


def test_what_pack_takes_and_what_stays():
    x = torch.randn(8, 16, device=DEVICE)
    w = torch.nn.Parameter(torch.randn(16, 16, device=DEVICE))
    marked = torch.randn(8, 16, device=DEVICE)
    small = torch.randn(2, device=DEVICE)
    h = torch.tanh(x)
    swap = pt.ActivationSwap(DEVICE, [("FWD", 0, 0), ("BWD", 0, 0)], offload=False, min_bytes=16)
    swap.keep(marked)
    st = swap._st
    assert isinstance(st.pack(h), torch.Tensor)  # no forward open: not the swap's
    with swap.forward(0, 0):
        for t, why in [
            (w, "a parameter"),
            (w.t(), "a view of a parameter"),
            (marked, "marked"),
            (small, "below min_bytes"),
            (torch.randn(4, 4), "on another device"),
        ]:
            if t.device != torch.device(DEVICE) or why != "on another device":
                assert isinstance(st.pack(t), torch.Tensor), why
        a, b, c = st.pack(h), st.pack(h[2:]), st.pack(h.t())
        assert isinstance(a, pt.extension().SavedTensor)
        assert (a.index, b.index, c.index) == (0, 0, 0)  # one storage, registered once
        assert st.pack(x).index == 1
        assert_same_bits(st.unpack(b), h[2:], "a view unpacked")
        assert_same_bits(st.unpack(c), h.t(), "a transposed view unpacked")
    assert swap.stats()["max_group_bytes"] == 0  # h and x are held by this test: both stay
    swap.abort()


class TwoViews(torch.autograd.Function):
    """Saves one storage through two views."""

    @staticmethod
    def forward(ctx, x):
        y = x * 2
        ctx.save_for_backward(y[:4], y.view(-1))
        return x + 0

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        return g * (a.sum() + b.sum())


def test_a_storage_saved_through_two_views_moves_once_and_comes_back_whole():
    x = torch.randn(8, 16, device=DEVICE, requires_grad=True)
    order = pt.schedule_orders("gpipe", 1, 5)[0]
    swap = pt.ActivationSwap(DEVICE, order, min_bytes=0)
    outs = {}
    for k, s, m in compute(order):
        if k == "FWD":
            with swap.forward(s, m):
                outs[m] = TwoViews.apply(x).sum()
        else:
            if m == 0:
                assert swap.group_state(0, 0) == "loaded" and swap.moved_storages(0, 0) == 1
            with swap.backward(s, m):
                outs.pop(m).backward()
    swap.end()
    y = x.detach() * 2
    assert torch.allclose(x.grad, torch.full_like(x, 5 * (y[:4].sum() + y.sum()).item()))
    assert swap.stats()["max_group_bytes"] == 8 * 16 * 4


def drop(swap, kinds):
    swap._steps = [e for e in swap._steps if e[0] not in kinds]


@pytest.mark.parametrize(
    "kinds,where,words",
    [
        (
            {"SWAP_WAIT_LOAD"},
            "micro-batch 0: the backward",
            "which is loading; its SWAP_WAIT_LOAD must come before the backward",
        ),
        (
            {"SWAP_LAUNCH_LOAD", "SWAP_WAIT_LOAD"},
            "micro-batch 0: the backward",
            "which is offloaded; its SWAP_WAIT_LOAD must come before",
        ),
        (
            {"SWAP_WAIT_OFFLOAD"},
            "micro-batch 0: the swap step SWAP_LAUNCH_LOAD",
            "'pp_swap_run1_s0_m0' is offloading; call wait_offload() first",
        ),
    ],
)
def test_each_wait_of_the_order_is_needed(kinds, where, words):
    swap = pt.ActivationSwap(DEVICE, ORDERS["gpipe"], min_bytes=0)
    drop(swap, kinds)  # the order broken on purpose: a wait left out
    with pytest.raises(RuntimeError) as e:
        run(ORDERS["gpipe"], True, swap=swap)
    assert words in str(e.value)  # pipeswap's own error, as itself
    assert e.value.__notes__ == [
        f"pipeswap: rank 0, stage 0, {where} failed; the step was aborted (every group released)"
    ]
    assert swap.stats()["groups"] == 0  # the step was aborted: every group released
    run(ORDERS["gpipe"], True, swap=pt.ActivationSwap(DEVICE, ORDERS["gpipe"], min_bytes=0))


def test_a_retained_graph_runs_again_unless_its_storages_moved():
    x = torch.randn(8, 16, device=DEVICE, requires_grad=True)
    # Never offloaded (the backward follows at once): the storages stay autograd's, as in torch.
    swap = pt.ActivationSwap(DEVICE, [("FWD", 0, 0), ("BWD", 0, 0)], min_bytes=0)
    with swap.forward(0, 0):
        y = torch.tanh(x * 3).sum()
    with swap.backward(0, 0):
        y.backward(retain_graph=True)
    swap.end()
    first = x.grad.clone()
    y.backward()
    assert_same_bits(x.grad, 2 * first, "the second backward of a retained graph")
    # Offloaded and loaded: the loaded copy is the group's, released after its backward.
    order = pt.schedule_orders("gpipe", 1, 5)[0]
    swap = pt.ActivationSwap(DEVICE, order, min_bytes=0)
    outs = {}
    for k, s, m in compute(order):
        if k == "FWD":
            with swap.forward(s, m):
                outs[m] = torch.tanh(x * (m + 1)).sum()
        else:
            with swap.backward(s, m):
                outs[m].backward(retain_graph=True)
    swap.end()
    assert swap.stats()["offloaded_bytes"] > 0
    with pytest.raises(RuntimeError, match="group 'pp_swap_run1_s0_m0' does not exist"):
        outs[0].backward()


def test_offloading_a_group_twice_is_refused():
    swap = pt.ActivationSwap(DEVICE, ORDERS["gpipe"], min_bytes=0)
    swap.begin()
    with swap.forward(0, 0):
        y = torch.tanh(torch.randn(8, 16, device=DEVICE, requires_grad=True) * 2).sum()
    st = swap._st
    with pytest.raises(RuntimeError, match="is offloading; launch_offload"):
        st.launch_offload(0, 0)  # the cursor launched it after the forward already
    swap.abort()
    del y


def test_the_order_is_a_cursor():
    swap = pt.ActivationSwap(DEVICE, ORDERS["gpipe"], min_bytes=0, rank=3)
    with pytest.raises(
        RuntimeError,
        match=r"rank 3: the training loop runs FWD of stage 0, micro-batch 1, but "
        r"pipeswap's order expects FWD of stage 0, micro-batch 0",
    ):
        with swap.forward(0, 1):
            pass
    swap.begin()
    with swap.forward(0, 0):
        pass
    with pytest.raises(
        RuntimeError, match="the step ended, but pipeswap's order still expects FWD of stage 0, micro-batch 1"
    ):
        swap.end()
    g0, _ = run(ORDERS["gpipe"], False)  # the object stays usable
    g1, _ = run(ORDERS["gpipe"], True, swap=swap)
    for a, b in zip(g0, g1):
        assert_same_bits(a, b, "gradient")


def test_a_failing_forward_aborts_the_step_and_names_it():
    swap = pt.ActivationSwap(DEVICE, ORDERS["gpipe"], min_bytes=0, rank=2)
    swap.begin()
    with swap.forward(0, 0):
        keep = torch.tanh(torch.randn(8, 16, device=DEVICE, requires_grad=True)).sum()
    with pytest.raises(ValueError) as e:  # the stage's own exception, as itself
        with swap.forward(0, 1):
            raise ValueError("boom")
    assert str(e.value) == "boom"
    assert e.value.__notes__ == [
        "pipeswap: rank 2, stage 0, micro-batch 1: the forward failed; the step was aborted (every group released)"
    ]
    assert swap.stats()["groups"] == 0 and swap.stats()["saved_bytes"] == 0  # the step's groups released
    with pytest.raises(RuntimeError, match="group 'pp_swap_run1_s0_m0' does not exist"):
        keep.backward()  # a graph of the aborted step fails at its saved tensor, never on freed memory


def test_bad_arguments_name_the_rule():
    order = ORDERS["gpipe"]
    for kw, words in [
        ({"load_lookahead": 0}, "load_lookahead must be at least 1"),
        ({"load_lookahead": -2}, "load_lookahead must be at least 1"),
        ({"offload_wait_delay": 0}, "offload_wait_delay must be at least 1"),
        ({"offload_wait_delay": 0, "offload": False}, "offload_wait_delay must be at least 1"),
        ({"min_bytes": -1}, "min_bytes must be >= 0, got -1"),
        ({"rank": -1}, "rank must be an integer >= 0"),
    ]:
        with pytest.raises(ValueError, match=words):
            pt.ActivationSwap(DEVICE, order, **kw)
    with pytest.raises(ValueError, match="entry 1 is SWAP_LAUNCH_OFFLOAD; pass the order without swap steps"):
        pt.ActivationSwap(DEVICE, [("FWD", 0, 0), ("SWAP_LAUNCH_OFFLOAD", 0, 0)])
    with pytest.raises(ValueError, match="composite OVERLAP_F_B"):
        pt.ActivationSwap(DEVICE, [("OVERLAP_F_B", None, None, [("FWD", 0, 1), ("BWD", 0, 0)])])
    with pytest.raises(ValueError, match="backward-before-forward"):
        pt.ActivationSwap(DEVICE, [("BWD", 0, 0), ("FWD", 0, 0)])
    with pytest.raises(ValueError, match="unknown kind 'zb'"):
        pt.schedule_orders("zb", 2, 4)
    with pytest.raises(ValueError, match="1f1b runs one stage per rank; stages_per_rank must be 1, got 2"):
        pt.schedule_orders("1f1b", 2, 4, 2)
    with pytest.raises(ValueError, match="'FWDX' is not a step kind"):
        pt.inject_swap_steps([("FWDX", 0, 0)])


def test_orders_check_like_pipeswap_validate():
    orders = pt.schedule_orders("interleaved_1f1b", 2, 4, 2)
    injected = [pt.inject_swap_steps(o, 2, 2) for o in orders]
    assert pt.check_orders(injected, 2) == ""
    broken = [list(o) for o in injected]
    broken[0] = [e for e in broken[0] if e is None or e[0] != "BWD_RECV"]
    assert "rank 1" in pt.check_orders(broken, 2) or "deadlock" in pt.check_orders(broken, 2)
    js = pt.orders_json(injected)
    assert js["ranks"][0][0] == {"type": "SWAP_SET_GROUP", "stage": 0, "micro": 0}


def test_one_budget_counts_activation_loads_and_optimizer_state():
    budget = pt.DeviceBudget(DEVICE, 1 << 30)
    with pytest.raises(RuntimeError, match="has a budget already; close"):
        pt.DeviceBudget(DEVICE, 1 << 20)
    try:
        net = Net().to(DEVICE)
        opt = pt.SwapAdamW(net.parameters(), lr=1e-3, swap_times=2, min_swap_numel=1)
        _, swap = run(ORDERS["gpipe"], True, net=net)
        opt.step()
        st = budget.stats()
        assert st["high_water_activation"] >= swap.stats()["max_group_bytes"] > 0
        assert st["high_water_optimizer"] > 0
        assert st["used"] == 0 and st["reload_demand"] == 0 and st["over_budget_count"] == 0
    finally:
        budget.close()


def test_a_strict_budget_refuses_a_load_that_does_not_fit():
    budget = pt.DeviceBudget(DEVICE, 1, strict=True)
    try:
        swap = pt.ActivationSwap(DEVICE, ORDERS["gpipe"], min_bytes=0)
        with pytest.raises(torch.OutOfMemoryError, match="activation") as e:  # as torch reports a device OOM
            run(ORDERS["gpipe"], True, swap=swap)
        assert re.fullmatch(
            r"pipeswap: rank 0, stage 0, micro-batch \d+: the swap step SWAP_LAUNCH_LOAD failed; .*",
            e.value.__notes__[0],
        )
        assert budget.stats()["refused_count"] >= 1 and budget.stats()["used"] == 0
        budget.capacity = 1 << 30  # the same objects work once the budget allows
        run(ORDERS["gpipe"], True, swap=swap)
    finally:
        budget.close()


CLI = os.environ.get("PIPESWAP_CLI") or str(
    pathlib.Path(__file__).resolve().parents[2] / "build" / "examples" / "pipeswap" / "pipeswap"
)


@pytest.mark.skipif(
    not os.access(CLI, os.X_OK),
    reason="the pipeswap command is not built (scripts/test.sh builds it first, or set PIPESWAP_CLI)",
)
def test_pipeswap_validate_accepts_the_orders_and_refuses_a_broken_one(tmp_path):
    orders = pt.schedule_orders("interleaved_1f1b", 2, 4, 2)
    swap = pt.ActivationSwap(DEVICE, orders[0], load_lookahead=2)
    good = tmp_path / "good.json"
    good.write_text(json.dumps(pt.orders_json([swap.order, orders[1]])))
    r = subprocess.run([CLI, "validate", str(good), "--stages-per-rank", "2"], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    broken = [e for e in swap.order if e is None or e[0] != "SWAP_WAIT_OFFLOAD"]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(pt.orders_json([broken, orders[1]])))
    r = subprocess.run([CLI, "validate", str(bad), "--stages-per-rank", "2"], capture_output=True, text=True)
    assert r.returncode == 1 and "SWAP_WAIT_OFFLOAD" in r.stdout + r.stderr, r.stdout + r.stderr
    assert pt.check_orders([broken, orders[1]], 2)  # the same checks in Python


def test_the_single_process_example_runs_and_its_gradients_match(tmp_path):
    example = pathlib.Path(__file__).resolve().parents[2] / "examples" / "torch" / "activation_offload.py"
    out = tmp_path / "figures.json"
    r = subprocess.run(
        [
            sys.executable,
            str(example),
            "--dim",
            "64",
            "--layers",
            "2",
            "--heads",
            "4",
            "--seq",
            "32",
            "--micro",
            "6",
            "--schedule",
            "gpipe",
            "--steps",
            "1",
            "--min-bytes",
            "0",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "gradients bit-identical: yes" in r.stdout
    fig = json.loads(out.read_text())
    assert fig["bit_identical"] and fig["offload"]["groups_in_flight"] < fig["no_offload"]["groups_in_flight"] == 6
    assert fig["offload"]["peak_saved_bytes"] < fig["no_offload"]["peak_saved_bytes"]


def test_opaque_and_point_to_point_steps_shape_the_placement_and_are_skipped():
    order = [("FSDP_UNSHARD", 0, None)] + list(ORDERS["gpipe"]) + [("FSDP_RESHARD", 0, None)]
    g0, _ = run(ORDERS["gpipe"], False)
    g1, swap = run(order, True, swap=pt.ActivationSwap(DEVICE, order, min_bytes=0))
    for a, b in zip(g0, g1):
        assert_same_bits(a, b, "gradient")
    assert swap.stats()["offloaded_bytes"] > 0


# ----- lifetimes: what is not moved is freed where autograd frees it -------------------------------


class Created(TorchDispatchMode):
    """Appends a weak reference to each storage an op creates (its outputs' storages, once each).
    pipeswap's StorageRef, not Tensor.untyped_storage(): a Python storage object would hold a
    reference of its own, and every storage would look shared."""

    def __init__(self, into):
        super().__init__()
        self.into = into

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.device == torch.device(DEVICE):
                ref = pt.extension().StorageRef(t)
                if ref.nbytes and not any(r.id == ref.id and not r.expired() for r in self.into):
                    self.into.append(ref)
        return out


class StepPeak(TorchDispatchMode):
    """The most bytes of storages allocated under it (by ops whose outputs alias no input) that are
    alive at once, checked after every op: the allocator's peak for what the step allocates."""

    def __init__(self):
        super().__init__()
        self.alive, self.peak = [], 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not any(r.alias_info is not None for r in func._schema.returns):
            for t in tree_leaves(out):
                if isinstance(t, torch.Tensor) and t.device == torch.device(DEVICE):
                    ref = pt.extension().StorageRef(t)
                    if ref.nbytes and not any(r.id == ref.id for r in self.alive):
                        self.alive.append(ref)
        self.alive = [r for r in self.alive if not r.expired()]
        self.peak = max(self.peak, sum(r.nbytes for r in self.alive))
        return out


def step_peak(order, swap=None):
    net = Net().to(DEVICE)
    xs = [torch.randn(8, 16, generator=torch.Generator().manual_seed(m)).to(DEVICE) for m in range(16)]
    losses = {}
    with StepPeak() as p:
        for k, s, m in compute(order):
            if k == "FWD":
                with swap.forward(s, m) if swap else contextlib.nullcontext():
                    losses[m] = net(xs[m]).square().mean()
            else:
                with swap.backward(s, m) if swap else contextlib.nullcontext():
                    losses.pop(m).backward()
        if swap:
            swap.end()
    return p.peak


def lifetimes(order, swap=None, hold=()):
    """One step of `order` (rank 0's stage 0), plain torch when `swap` is None. Returns the
    storages each forward created (weak references) and, at each autograd node the backward runs and
    at the end of each backward, which of them are alive (a tuple of bools, creation order). The
    forwards of the micro-batches in `hold` keep their hidden activation in a list (so it is shared
    when the group offloads); the list is cleared before the first backward."""
    net = Net().to(DEVICE)
    xs = [torch.randn(8, 16, generator=torch.Generator().manual_seed(m)).to(DEVICE) for m in range(16)]
    created, held, losses, snaps, first_bwd = [], [], {}, [], {}

    def snap(*_):
        snaps.append(tuple(not r.expired() for r in created))

    def hook_all(fn):
        seen, todo = set(), [fn]
        while todo:
            f = todo.pop()
            if f is None or f in seen:
                continue
            seen.add(f)
            f.register_prehook(snap)
            todo.extend(g for g, _ in f.next_functions)

    for k, s, m in compute(order):
        if k == "FWD":
            with swap.forward(s, m) if swap else contextlib.nullcontext(), Created(created):
                h = torch.tanh(net.a(xs[m]))
                losses[m] = net.norm(net.b(h)).square().mean()
                if m in hold:
                    held.append(h)
                del h
        else:
            held.clear()
            first_bwd[m] = len(snaps)
            hook_all(losses[m].grad_fn)
            with swap.backward(s, m) if swap else contextlib.nullcontext():
                losses.pop(m).backward()
            snap()
    if swap:
        swap.end()
    snap()
    return created, snaps, first_bwd


def deaths(created, snaps):
    """For each storage, the first snapshot where it is gone (len(snaps) if never)."""
    return [
        next((j for j, sn in enumerate(snaps) if i < len(sn) and not sn[i]), len(snaps)) for i in range(len(created))
    ]


def alive_peak(created, snaps):
    return max(sum(r.nbytes for r, alive in zip(created, sn) if alive) for sn in snaps)


@pytest.mark.parametrize("case", ["offload off", "order swaps nothing"])
def test_with_nothing_to_offload_every_storage_is_freed_where_torch_frees_it(case):
    if case == "offload off":
        order, offload = ORDERS["gpipe"], False
    else:  # the last rank of 1F1B: each backward right after its forward, too close to swap
        order, offload = pt.schedule_orders("1f1b", 4, 8)[3], True
    swap = pt.ActivationSwap(DEVICE, order, offload=offload, min_bytes=0)
    assert not any(e[0] == "SWAP_LAUNCH_OFFLOAD" for e in swap.order if e is not None)
    c0, s0, _ = lifetimes(order)
    c1, s1, _ = lifetimes(order, swap)
    assert [r.nbytes for r in c0] == [r.nbytes for r in c1] and len(c0) > 30
    assert s1 == s0  # the same storages alive at every node of every backward
    assert alive_peak(c1, s1) / alive_peak(c0, s0) == 1.0
    assert swap.stats()["peak_saved_bytes"] > 0  # the hooks did take the storages
    # Everything the step allocates, forward and backward: the same peak as torch's, exactly.
    again = pt.ActivationSwap(DEVICE, order, offload=offload, min_bytes=0)
    assert step_peak(order, again) / step_peak(order) == 1.0


def test_an_offloaded_group_frees_what_it_did_not_move_where_torch_frees_it():
    order = ORDERS["gpipe"]
    seen = []
    swap = pt.ActivationSwap(
        DEVICE,
        order,
        min_bytes=0,
        on_swap_step=lambda k, s, m: (
            seen.append((k, s, m, swap.moved_storages(s, m), swap._st.autograd_held(s, m)))
            if k == "SWAP_LAUNCH_LOAD"
            else None
        ),
    )
    c0, s0, first = lifetimes(order, hold={0, 3})
    c1, s1, _ = lifetimes(order, swap, hold={0, 3})
    d0, d1 = deaths(c0, s0), deaths(c1, s1)
    same = [i for i in range(len(c0)) if d0[i] == d1[i]]
    moved = [i for i in range(len(c0)) if d0[i] != d1[i]]
    assert moved and same
    for i in moved:  # only a moved storage dies elsewhere: before any backward (behind its offload)
        assert d1[i] <= first[0] < d0[i]
    # The held activations (micro-batches 0 and 3) stay and are freed by their backward, not later.
    loads = {m: (n, kept) for k, s, m, n, kept in seen}
    assert len(loads) == 8 and all(n > 0 for n, _ in loads.values())
    base = loads[1][1]  # the input, which the test holds (xs), in every group
    assert loads[0][1] == loads[3][1] == base + 1 and all(loads[m][1] == base for m in (1, 2, 4, 5, 6, 7))
