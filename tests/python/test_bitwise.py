"""SwapAdam/SwapAdamW against torch.optim.Adam/AdamW, bit for bit.

Inputs: every OptimizerInfo input torch tests Adam and AdamW with on this device (its
optim_inputs_func, with the foreach/fused/differentiable variants torch adds for the device), plus
foreach=True on the CPU, over float32 and bfloat16 parameters and several swap configurations
(swap_times 1, 3, 16; the packed and per-tensor pipelines; resident share, deferred offload and
prefetch between steps). Two parameter groups with their own lr and weight_decay, an LR scheduler,
12 steps, parameters without a gradient on some steps and one that starts late (per-parameter step
counts). After the steps every parameter and every state tensor must have torch's bits.
"""

import copy

import pytest
import torch

pytest.importorskip("expecttest", reason="torch's OptimizerInfo database needs expecttest (pip install expecttest)")
from conftest import DEVICE, assert_same_bits, assert_same_state  # noqa: E402
from torch.testing._internal.common_optimizers import _get_optim_inputs_including_global_cliquey_kwargs, optim_db  # noqa: E402

from pipeswap.torch import SwapAdam, SwapAdamW  # noqa: E402

PAIRS = {torch.optim.Adam: SwapAdam, torch.optim.AdamW: SwapAdamW}
INFOS = [info for info in optim_db if info.optim_cls in PAIRS]
assert len(INFOS) == 2, "torch's optim_db has no Adam/AdamW entries"

SHAPES = [(64, 33), (257,), (5,), (16, 16), (3, 7, 11), (1000,)]
STEPS = 12

SWAPS = {
    "packed-1": dict(swap_times=1),
    "packed-3": dict(swap_times=3),
    "per_tensor-3": dict(swap_times=3, packed=False),
    "packed-16-phases": dict(swap_times=16, resident_share=40000, defer_offload=True),
    "per_tensor-2-phases": dict(swap_times=2, packed=False, defer_offload=True),
}


def _inputs():
    out = []
    for info in INFOS:
        inputs = _get_optim_inputs_including_global_cliquey_kwargs(DEVICE, None, info)
        if DEVICE.type == "cpu":  # torch lists no foreach variant for the CPU; it runs there too
            inputs += [
                type(i)(params=None, kwargs={**i.kwargs, "foreach": True}, desc=f"{i.desc} & foreach (cpu)")
                for i in info.optim_inputs_func(DEVICE)
            ]
        for i in inputs:
            out.append(pytest.param(info.optim_cls, i.kwargs, id=f"{info.optim_cls.__name__}-{i.desc}"))
    return out


INPUTS = _inputs()
DIFFERENTIABLE = [p for p in INPUTS if p.values[1].get("differentiable")]
PLAIN = [p for p in INPUTS if not p.values[1].get("differentiable")]


def make_params(dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g).to(device=DEVICE, dtype=dtype).requires_grad_() for s in SHAPES]


def groups_of(params, kwargs):
    """Two groups: the second with its own lr (a tensor when the input's lr is one) and weight_decay."""
    lr = kwargs.get("lr", 1e-3)
    lr2 = torch.tensor(float(lr) * 0.5) if isinstance(lr, torch.Tensor) else lr * 0.5
    return [{"params": params[:3]}, {"params": params[3:], "lr": lr2, "weight_decay": 0.05}]


def set_grads(params, step, dtype, seed=1):
    g = torch.Generator().manual_seed(seed * 1000 + step)
    for k, p in enumerate(params):
        grad = torch.randn(p.shape, generator=g).to(device=DEVICE, dtype=dtype)
        skip = (k == 2 and step % 3 == 1) or (k == 4 and step < 2)
        p.grad = None if skip else grad


def run(cls, kwargs, dtype, swap=None, steps=STEPS, phases=False, mutate=None):
    """Trains a fresh model for `steps` steps; returns (params, optimizer)."""
    params = make_params(dtype)
    kw = copy.deepcopy(kwargs)
    opt = cls(groups_of(params, kw), **kw, **(swap or {}))
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.5)
    for step in range(steps):
        opt.zero_grad()
        set_grads(params, step, dtype)
        if phases:
            opt.prefetch(1)  # as a backward hook would, before the step; then the rest
            opt.prefetch()
        opt.step()
        if mutate:
            mutate(opt, step)
        if phases and step % 2:
            opt.finish_offload()
            assert not opt.offload_pending
        sched.step()
    return params, opt


def check(torch_cls, kwargs, dtype, swap, phases=False):
    ref_params, ref = run(torch_cls, kwargs, dtype)
    params, opt = run(PAIRS[torch_cls], kwargs, dtype, swap, phases=phases)
    for k, (a, b) in enumerate(zip(params, ref_params)):
        assert_same_bits(a, b, f"param {k}")
    assert_same_state(opt.state_dict(), ref.state_dict())
    return opt


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("swap", list(SWAPS), ids=list(SWAPS))
@pytest.mark.parametrize("torch_cls,kwargs", PLAIN)
def test_bitwise(torch_cls, kwargs, swap, dtype):
    try:
        run(torch_cls, kwargs, dtype, steps=1)
    except Exception as e:  # torch refuses this input on this device and dtype: so must we, alike
        with pytest.raises(type(e)):
            run(PAIRS[torch_cls], kwargs, dtype, SWAPS[swap], steps=1)
        return
    phases = swap.endswith("phases")
    opt = check(torch_cls, kwargs, dtype, SWAPS[swap], phases=phases)
    stats = opt.swap_stats()
    assert stats["swappable_bytes"] > 0 and stats["host_store_bytes"] == stats["swappable_bytes"]
    assert stats["unswappable_bytes"] > 0  # the (5,) parameter's state stays on the device
    if SWAPS[swap].get("resident_share"):
        assert stats["resident_batches"] >= 1


@pytest.mark.parametrize("torch_cls,kwargs", DIFFERENTIABLE)
def test_differentiable_is_refused(torch_cls, kwargs):
    with pytest.raises(ValueError, match="differentiable=True is not supported"):
        PAIRS[torch_cls](make_params(torch.float32), **kwargs)


def test_input_count():
    # torch's own inputs for the two optimizers on this device, including its fused/differentiable
    # variants (15 each on the CPU in torch 2.15), all of them covered above.
    n = sum(len(_get_optim_inputs_including_global_cliquey_kwargs(DEVICE, None, i)) for i in INFOS)
    assert n >= 10 and len(PLAIN) + len(DIFFERENTIABLE) >= n


def test_corrupted_state_is_caught():
    """The oracle can fail: one flipped bit in one state tensor after a step makes the comparison
    fail (the same harness as test_bitwise)."""

    def corrupt(opt, step):
        if step == 5:
            views = opt._rt.state_views(opt._index[opt.param_groups[0]["params"][0]])
            views[0].view(torch.int32).view(-1)[7] ^= 1 << 22  # the mantissa's top bit

    ref_params, ref = run(torch.optim.AdamW, {}, torch.float32)
    params, opt = run(SwapAdamW, {}, torch.float32, SWAPS["packed-3"], mutate=corrupt)
    with pytest.raises(AssertionError, match="differ"):
        for k, (a, b) in enumerate(zip(params, ref_params)):
            assert_same_bits(a, b, f"param {k}")
        assert_same_state(opt.state_dict(), ref.state_dict())


@pytest.mark.parametrize("impl", [dict(foreach=False), dict(fused=True)], ids=["single_tensor", "fused"])
@pytest.mark.parametrize("torch_cls", [torch.optim.Adam, torch.optim.AdamW], ids=["Adam", "AdamW"])
def test_tensor_lr_with_a_scheduler(torch_cls, impl):
    # A tensor lr (torch's schedulers fill_ it in place), on every device, with its own value per group.
    kwargs = dict(lr=torch.tensor(0.01), weight_decay=0.1, **impl)
    for swap in ("packed-3", "per_tensor-2-phases"):
        check(torch_cls, kwargs, torch.float32, SWAPS[swap], phases=swap.endswith("phases"))
