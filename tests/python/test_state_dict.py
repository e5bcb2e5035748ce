"""State dicts in torch's format: interop both ways with torch.optim.Adam/AdamW, bit-exact resume,
torch.save / torch.load(weights_only=True), CPU state tensors, host-canonical loads."""

import io

import pytest
import torch
from conftest import DEVICE, assert_same_bits, assert_same_state

from pipeswap.torch import SwapAdam, SwapAdamW

SHAPES = [(40, 30), (300,), (7,), (20, 20)]
KWARGS = [
    dict(lr=0.01, weight_decay=0.1),
    dict(lr=0.01, weight_decay=0.1, amsgrad=True),
    dict(lr=0.01, maximize=True, fused=True),
]


def params(dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g).to(device=DEVICE, dtype=dtype).requires_grad_() for s in SHAPES]


def clone(ps):
    return [p.detach().clone().requires_grad_() for p in ps]


def groups(ps):
    return [{"params": ps[:2]}, {"params": ps[2:], "lr": 0.003}]


def train(opt, ps, steps, start=0):
    for step in range(start, start + steps):
        g = torch.Generator().manual_seed(100 + step)
        opt.zero_grad()
        for k, p in enumerate(ps):
            if k == 1 and step % 5 == 0:
                continue  # a parameter without a gradient this step
            p.grad = torch.randn(p.shape, generator=g).to(device=DEVICE, dtype=p.dtype)
        opt.step()


def roundtrip(sd):
    buf = io.BytesIO()
    torch.save(sd, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


@pytest.mark.parametrize("kw", KWARGS, ids=["plain", "amsgrad", "fused-maximize"])
@pytest.mark.parametrize(
    "torch_cls,swap_cls", [(torch.optim.AdamW, SwapAdamW), (torch.optim.Adam, SwapAdam)], ids=["AdamW", "Adam"]
)
def test_torch_to_swap_and_back(torch_cls, swap_cls, kw):
    # torch trains 5 steps; its state dict (saved and loaded as weights) goes into the swap
    # optimizer, which trains 5 more; that one's state dict goes back into a torch optimizer for 5
    # more. A torch optimizer that trained 15 steps straight is the oracle for every bit.
    ref_ps = params()
    ref = torch_cls(groups(ref_ps), **kw)
    train(ref, ref_ps, 15)

    ps = params()
    t = torch_cls(groups(ps), **kw)
    train(t, ps, 5)
    s = swap_cls(groups(ps), **kw, swap_times=2, min_swap_numel=8)
    s.load_state_dict(roundtrip(t.state_dict()))
    assert_same_state(s.state_dict(), t.state_dict(), "after load: ")
    train(s, ps, 5, start=5)
    sd = s.state_dict()
    for entry in sd["state"].values():
        assert all(v.device.type == "cpu" for v in entry.values())
    t2 = torch_cls(groups(ps), **kw)
    t2.load_state_dict(roundtrip(sd))
    train(t2, ps, 5, start=10)
    for k, (a, b) in enumerate(zip(ps, ref_ps)):
        assert_same_bits(a, b, f"param {k}")
    assert_same_state(t2.state_dict(), ref.state_dict())


@pytest.mark.parametrize("packed", [True, False])
def test_resume_swap_to_swap(packed):
    ref_ps = params()
    ref = torch.optim.AdamW(groups(ref_ps), lr=0.02, amsgrad=True)
    train(ref, ref_ps, 12)

    ps = params()
    a = SwapAdamW(groups(ps), lr=0.02, amsgrad=True, swap_times=3, packed=packed, min_swap_numel=8)
    train(a, ps, 6)
    saved = roundtrip(a.state_dict())
    del a
    b = SwapAdamW(
        groups(ps),
        lr=0.02,
        amsgrad=True,
        swap_times=2,
        packed=not packed,
        defer_offload=True,
    )
    b.load_state_dict(saved)
    train(b, ps, 6, start=6)
    for k, (x, y) in enumerate(zip(ps, ref_ps)):
        assert_same_bits(x, y, f"param {k}")
    assert_same_state(b.state_dict(), ref.state_dict())


def test_load_is_host_canonical_and_resets_unlisted_state():
    ps = params()
    s = SwapAdamW(groups(ps), lr=0.01, swap_times=2, min_swap_numel=8)
    train(s, ps, 3)
    t = torch.optim.AdamW(groups(clone(ps)), lr=0.01)
    s.load_state_dict(t.state_dict())  # torch's fresh optimizer: no state at all
    assert s.state_dict()["state"] == {}
    # The next step starts every parameter from zero state, as torch does after that load.
    ref_ps = clone(ps)
    ref = torch.optim.AdamW(groups(ref_ps), lr=0.01)
    train(s, ps, 2, start=50)
    train(ref, ref_ps, 2, start=50)
    for k, (x, y) in enumerate(zip(ps, ref_ps)):
        assert_same_bits(x, y, f"param {k}")
    # Loaded state lives in pipeswap's host store: opt.state shows torch's keys over it, no copies.
    assert all(list(v) == ["step", "exp_avg", "exp_avg_sq"] for v in s.state.values())
    sd = s.state_dict()
    for n, p in enumerate(ps):
        assert s.state[p]["exp_avg"].data_ptr() == sd["state"][n]["exp_avg"].data_ptr()
        assert s.state[p]["step"] is sd["state"][n]["step"]
    assert s.swap_stats()["host_store_bytes"] > 0


def test_state_tensors_and_checkpoint_keys():
    ps = params()
    s = SwapAdam(ps, amsgrad=True, swap_times=4, min_swap_numel=8)
    assert s.state_tensors(ps[0]) == {}
    train(s, ps, 2)
    st = s.state_tensors(ps[0])
    assert list(st) == ["step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"]
    assert st["step"].item() == 2 and st["exp_avg"].shape == ps[0].shape
    with pytest.raises(KeyError):
        s.state_tensors(torch.zeros(3))


def test_named_parameters():
    # torch >= 2.6 takes (name, tensor) pairs and keeps the names in the groups and the state dict.
    m = torch.nn.Linear(20, 30).to(DEVICE)
    ref_m = torch.nn.Linear(20, 30).to(DEVICE)
    ref_m.load_state_dict(m.state_dict())
    opt = SwapAdamW(m.named_parameters(), lr=0.01, swap_times=2, min_swap_numel=8)
    ref = torch.optim.AdamW(ref_m.named_parameters(), lr=0.01)
    if "param_names" not in ref.param_groups[0]:
        pytest.skip("this torch does not take named parameters")
    for step in range(3):
        for mm, o in ((m, opt), (ref_m, ref)):
            o.zero_grad()
            mm(torch.ones(4, 20, device=DEVICE) * step).sum().backward()
            o.step()
    assert opt.param_groups[0]["param_names"] == ["weight", "bias"]
    assert_same_state(opt.state_dict(), ref.state_dict())
    assert_same_bits(m.weight, ref_m.weight, "weight")
