"""Bad input gets a standard Python exception naming the parameter or group and the rule; nothing is
lost and the optimizer stays usable: after each refusal, training goes on bit-identically to a torch
optimizer that never saw the bad input."""

import copy
import gc
import pickle

import pytest
import torch
from conftest import DEVICE, assert_same_bits, assert_same_state

from pipeswap.torch import DeviceBudget, SwapAdam, SwapAdamW

SHAPES = [(30, 20), (100,), (6,)]


def params(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g).to(DEVICE).requires_grad_() for s in SHAPES]


def grads(ps, step):
    g = torch.Generator().manual_seed(7 + step)
    for p in ps:
        p.grad = torch.randn(p.shape, generator=g).to(device=DEVICE, dtype=p.dtype)


class Pair:
    """A SwapAdamW and a torch AdamW trained side by side on their own copies of one model."""

    def __init__(self, **swap):
        self.ps, self.ref_ps = params(), params()
        self.opt = SwapAdamW(self.ps, lr=0.01, amsgrad=True, swap_times=2, min_swap_numel=8, **swap)
        self.ref = torch.optim.AdamW(self.ref_ps, lr=0.01, amsgrad=True)
        self.n = 0

    def train(self, steps=3):
        for _ in range(steps):
            grads(self.ps, self.n)
            grads(self.ref_ps, self.n)
            self.opt.step()
            self.ref.step()
            self.n += 1

    def check(self):
        for k, (a, b) in enumerate(zip(self.ps, self.ref_ps)):
            assert_same_bits(a, b, f"param {k}")
        assert_same_state(self.opt.state_dict(), self.ref.state_dict())


@pytest.fixture
def pair():
    p = Pair()
    p.train()
    yield p
    p.train()  # usable after the refusal, and nothing was lost
    p.check()


def test_sparse_gradient(pair):
    good = pair.ps[1].grad
    grads(pair.ps, 99)
    pair.ps[1].grad = good.to_sparse()
    with pytest.raises(ValueError, match=r"param_groups\[0\]\['params'\]\[1\] has a sparse gradient"):
        pair.opt.step()


SLOT_DTYPES = r"; state slots hold float32, float64, bfloat16 or float16"


def test_complex_parameter():
    with pytest.raises(ValueError, match=r"param_groups\[0\]\['params'\]\[1\] has dtype torch.complex64" + SLOT_DTYPES):
        SwapAdamW([torch.zeros(3, requires_grad=True), torch.zeros(3, dtype=torch.complex64, requires_grad=True)])


def test_parameter_layout_and_dtype_rule():
    # One rule, pipeswap._C's (the one its add_param applies), asked before a parameter joins.
    ok = torch.zeros(3, requires_grad=True)
    with pytest.raises(
        ValueError, match=r"^SwapAdamW: param_groups\[0\]\['params'\]\[1\] has dtype torch.int64" + SLOT_DTYPES
    ):
        SwapAdamW([ok, torch.zeros(3, dtype=torch.int64)])
    # Strides (2, 2) over (3, 3) span exactly 9 elements but reach only 5 of them: overlapping.
    overlapping = torch.zeros(9).as_strided((3, 3), (2, 2)).detach().requires_grad_()
    with pytest.raises(
        ValueError,
        match=r"^SwapAdam: param_groups\[0\]\['params'\]\[1\] is not dense and non-overlapping \(shape \[3, 3\], "
        r"stride \[2, 2\]\); its state slots need a layout that holds every element exactly once$",
    ):
        SwapAdam([ok, overlapping])
    # A parameter without elements holds each of them once, whatever its strides: it joins and steps
    # as in torch.
    empty, ref_empty = torch.zeros(2, 0, requires_grad=True), torch.zeros(2, 0, requires_grad=True)
    full, ref_full = torch.ones(3, requires_grad=True), torch.ones(3, requires_grad=True)
    opt = SwapAdamW([empty, full], lr=0.1, min_swap_numel=0, swap_times=2)
    ref = torch.optim.AdamW([ref_empty, ref_full], lr=0.1)
    for p in (empty, full, ref_empty, ref_full):
        p.grad = torch.full_like(p, 0.5)
    opt.step()
    ref.step()
    assert torch.equal(full.detach(), ref_full.detach()) and empty.shape == (2, 0)
    assert opt.state_tensors(empty)["exp_avg"].shape == (2, 0)


def test_complex_gradient_on_a_complex_parameter_group(pair):
    with pytest.raises(ValueError, match=r"param_groups\[1\]\['params'\]\[0\] has dtype torch.complex64"):
        pair.opt.add_param_group({"params": [torch.zeros(4, dtype=torch.complex64, device=DEVICE, requires_grad=True)]})
    assert len(pair.opt.param_groups) == 1


def test_parameters_on_different_devices(pair):
    other = torch.zeros(4, device="meta", requires_grad=True)
    with pytest.raises(
        ValueError,
        match=r"param_groups\[1\]\['params'\]\[1\] is on meta but the optimizer's "
        r"parameters are on (cpu|cuda:0); all parameters of one optimizer must share",
    ):
        pair.opt.add_param_group({"params": [torch.zeros(4, device=DEVICE, requires_grad=True), other]})
    assert len(pair.opt.param_groups) == 1
    with pytest.raises(ValueError, match="must share a device"):
        SwapAdamW([torch.zeros(3, requires_grad=True), torch.zeros(3, device="meta", requires_grad=True)])


def test_parameter_listed_twice(pair):
    p = torch.zeros(5, device=DEVICE, requires_grad=True)
    with pytest.raises(ValueError, match=r"param_groups\[1\]\['params'\]\[1\] is listed twice"):
        pair.opt.add_param_group({"params": [p, p]})
    with pytest.raises(ValueError, match=r"param_groups\[1\]\['params'\]\[0\] is listed twice"):
        pair.opt.add_param_group({"params": [pair.ps[0]]})  # already in group 0
    assert len(pair.opt.param_groups) == 1
    with pytest.raises(ValueError, match="listed twice"):
        SwapAdam([p, p])


def test_dtype_changed_between_steps(pair):
    p = pair.ps[0]
    keep = p.data
    p.data = p.data.double()
    grads(pair.ps, 99)
    with pytest.raises(
        ValueError,
        match=r"param_groups\[0\]\['params'\]\[0\] changed dtype from torch.float32 "
        r"to torch.float64",
    ):
        pair.opt.step()
    p.data = keep


def test_layout_changed_between_steps(pair):
    p = pair.ps[0]
    keep = p.data
    p.data = p.data.t().contiguous()
    grads(pair.ps, 99)
    with pytest.raises(ValueError, match=r"\['params'\]\[0\] changed layout from shape \(30, 20\)"):
        pair.opt.step()
    p.data = keep


@pytest.mark.skipif(not torch.cuda.is_available(), reason="moving a parameter needs a second device (CUDA)")
def test_device_changed_between_steps():
    ps = [torch.randn(50, requires_grad=True)]
    opt = SwapAdamW(ps, swap_times=1)
    grads(ps, 0)
    opt.step()
    ps[0].data = ps[0].data.cuda()
    ps[0].grad = torch.randn(50, device="cuda")
    with pytest.raises(ValueError, match=r"\['params'\]\[0\] moved from cpu to cuda:0"):
        opt.step()


def another_model_state(pair, mutate):
    other = Pair()
    other.train(2)
    sd = copy.deepcopy(other.opt.state_dict())
    mutate(sd)
    return sd


@pytest.mark.parametrize(
    "mutate,match",
    [
        (
            lambda sd: sd["state"][0].update(exp_avg=torch.zeros(20, 30)),
            r"state\[0\] \(param_groups\[0\]\['params'\]\[0\]\)\['exp_avg'\] is \(20, 30\) but the parameter has shape "
            r"\(30, 20\): a state dict of another model",
        ),
        (
            lambda sd: sd["param_groups"].append(dict(sd["param_groups"][0], params=[9])),
            r"the state dict has 2 parameter group\(s\), this optimizer 1",
        ),
        (
            lambda sd: sd["param_groups"][0]["params"].pop(),
            r"param_groups\[0\] has 2 parameter\(s\) in the state dict, 3 here",
        ),
        (lambda sd: sd["state"][1].pop("max_exp_avg_sq"), r"state\[1\] .* has keys .* expected"),
        (lambda sd: sd["state"].__setitem__(17, sd["state"][0]), r"state for id 17, which no parameter group"),
        (lambda sd: sd["param_groups"][0].update(amsgrad=False), r"\['amsgrad'\] is False in the state dict"),
        (lambda sd: sd["state"][2].update(step="x"), r"state\[2\] .*\['step'\] must be a number"),
    ],
    ids=["shape", "groups", "group-size", "missing-key", "unknown-id", "amsgrad", "step"],
)
def test_state_dict_of_another_model(pair, mutate, match):
    before = pair.opt.state_dict()
    lr = pair.opt.param_groups[0]["lr"]
    with pytest.raises(ValueError, match=match):
        pair.opt.load_state_dict(another_model_state(pair, mutate))
    assert_same_state(pair.opt.state_dict(), before)  # nothing changed
    assert pair.opt.param_groups[0]["lr"] == lr


def test_swap_settings():
    ps = params()
    with pytest.raises(ValueError, match="swap_times must be at least 1, got 0"):
        SwapAdamW(ps, swap_times=0)
    with pytest.raises(TypeError, match="swap_times must be an int"):
        SwapAdamW(ps, swap_times="4")
    with pytest.raises(TypeError, match="packed must be a bool, got str"):
        SwapAdamW(ps, packed="per_tensor")
    with pytest.raises(ValueError, match="resident_share must be at least 0"):
        SwapAdamW(ps, resident_share=-1)
    with pytest.raises(ValueError, match="differentiable=True is not supported"):
        SwapAdamW(ps, differentiable=True)
    with pytest.raises(ValueError, match="Invalid learning rate"):  # torch's own validation
        SwapAdamW(ps, lr=-1.0)


def test_configure_swap_keeps_the_state(pair):
    with pytest.raises(TypeError, match=r"unknown setting\(s\) \['swaps'\]"):
        pair.opt.configure_swap(swaps=3)
    with pytest.raises(ValueError, match="swap_times must be at least 1"):
        pair.opt.configure_swap(swap_times=0)
    pair.opt.configure_swap(swap_times=1, packed=False, defer_offload=True)
    assert pair.opt.swap_settings["packed"] is False


def test_group_amsgrad_changed(pair):
    pair.opt.param_groups[0]["amsgrad"] = False
    grads(pair.ps, 99)
    with pytest.raises(ValueError, match=r"param_groups\[0\]\['amsgrad'\] changed to False"):
        pair.opt.step()
    pair.opt.param_groups[0]["amsgrad"] = True


def test_not_picklable(pair):
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(pair.opt)


def test_failure_inside_the_update():
    # torch's update raises in the second batch: the exception reaches the caller as itself, the
    # batches after it are untouched, and the optimizer goes on.
    p = Pair()
    p.train(2)
    calls = []
    inner_step = p.opt._inner_step  # torch's AdamW.step, run on each batch

    def failing_step(*a, **k):
        calls.append(1)
        if len(calls) == 2:
            raise ArithmeticError("injected")
        return inner_step(*a, **k)

    p.opt._inner_step = failing_step
    before = [x.detach().clone() for x in p.ps]
    grads(p.ps, 50)
    with pytest.raises(ArithmeticError, match="injected"):
        p.opt.step()
    p.opt._inner_step = inner_step
    batch0 = {id(x) for x in p.ps if not torch.equal(x.detach(), before[[id(y) for y in p.ps].index(id(x))])}
    assert 0 < len(batch0) < len(p.ps)  # the first batch was updated, the failing one was not
    p.opt.step()  # usable; every parameter steps again
    sd = p.opt.state_dict()
    assert len(sd["state"]) == 3


def test_a_strict_budget_refuses_a_step_as_torch_reports_a_device_oom():
    # The optimizer path keeps the error's type: a reservation a strict DeviceBudget refuses reaches
    # step()'s caller as torch.OutOfMemoryError (pipeswap._C translates it; SwapAdamW does not wrap
    # it); no parameter changed, and the same optimizer trains on bit-identically to torch's once
    # the budget allows.
    p = Pair()
    budget = DeviceBudget(DEVICE, 1, strict=True)
    try:
        grads(p.ps, 0)
        with pytest.raises(torch.OutOfMemoryError, match=r"client needs \d+ bytes but the strict budget has 1 of 1"):
            p.opt.step()
        for k, (a, b) in enumerate(zip(p.ps, p.ref_ps)):
            assert_same_bits(a, b, f"param {k} after the refused step")
        assert budget.stats()["refused_count"] >= 1
        budget.capacity = 1 << 30
        p.train(3)
        p.check()
    finally:
        del p
        gc.collect()
        budget.close()
