"""The runtime's phases from Python: prefetch (from a backward hook), resident share, deferred
offload; with them on, the bits stay torch's."""

import pytest
import torch
from conftest import DEVICE, assert_same_bits, assert_same_state

from pipeswap.torch import SwapAdamW, extension


def model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.Linear(64, 8)
    ).to(DEVICE)


def test_prefetch_from_a_backward_hook_is_bit_identical():
    m, ref_m = model(), model()
    opt = SwapAdamW(m.parameters(), lr=0.01, swap_times=4, defer_offload=True, min_swap_numel=8)
    ref = torch.optim.AdamW(ref_m.parameters(), lr=0.01)
    seen = []
    # The first layer's gradient is accumulated last: from there the next step's state starts loading.
    m[0].weight.register_post_accumulate_grad_hook(lambda p: seen.append(opt.prefetch()))
    assert opt.prefetch() == 0  # before the first step no batch order is known
    g = torch.Generator().manual_seed(3)
    for _step in range(10):
        x = torch.randn(16, 32, generator=g).to(DEVICE)
        for mm, o in ((m, opt), (ref_m, ref)):
            o.zero_grad()
            mm(x).square().mean().backward()
            o.step()
        assert opt.offload_pending  # step() returned with its last D2Hs in flight
    assert seen[0] == 0 and all(k == 4 for k in seen[1:]), seen
    assert opt.swap_stats()["prefetched_batches"] == 0  # the last step consumed them
    opt.finish_offload()
    assert not opt.offload_pending
    for a, b in zip(m.parameters(), ref_m.parameters()):
        assert_same_bits(a, b, "param")
    assert_same_state(opt.state_dict(), ref.state_dict())


@pytest.mark.parametrize("packed", [True, False])
def test_resident_share_and_prefetch_limit(packed):
    m = model()
    opt = SwapAdamW(m.parameters(), swap_times=4, packed=packed, resident_share=1, min_swap_numel=8)
    m(torch.randn(4, 32, device=DEVICE)).sum().backward()
    opt.step()
    assert opt.swap_stats()["resident_batches"] == 0  # 1 byte rounds down to no whole batch
    opt.configure_swap(resident_share=10**9)
    opt.step()
    stats = opt.swap_stats()
    assert stats["resident_batches"] == stats["batches"] == 4
    assert opt.prefetch() == 4  # everything is resident already
    opt.configure_swap(resident_share=0)
    opt.step()
    assert opt.prefetch(1) == 1 and opt.prefetch(2) == 3 and opt.prefetch() == 4
    with pytest.raises(ValueError, match="max_batches must be None or an int"):
        opt.prefetch(-1)
    opt.synchronize()  # everything home; the next step loads again
    assert opt.swap_stats()["prefetched_batches"] == 0


def test_backend_rules():
    extension()._backend_selftest(DEVICE)


def test_cuda_path_compiled():
    # With a CUDA build of torch (CI installs one), the torch backend's CUDA path must have been
    # compiled into the extension, GPU or not.
    if torch.version.cuda is None:
        pytest.skip("this torch has no CUDA")
    assert extension().has_cuda


def test_a_call_from_inside_the_step_is_refused():
    # Code that runs inside SwapAdamW.step() (here: around torch's update of a batch) and calls back
    # into the runtime is refused, and the step fails.
    m = model()
    opt = SwapAdamW(m.parameters(), swap_times=2, min_swap_numel=8)
    m(torch.randn(4, 32, device=DEVICE)).sum().backward()
    opt.step()
    inner_step = opt._inner_step

    def reentering(inner):
        opt.prefetch()
        return inner_step(inner)

    opt._inner_step = reentering
    try:
        with pytest.raises(RuntimeError, match="not reentrant|from inside|reentr"):
            opt.step()
    finally:
        opt._inner_step = inner_step
    opt.step()  # usable afterwards


def test_two_optimizers_share_a_device():
    # Optimizers on one device share its backend and copy streams; stepped in turn, each still gives
    # torch's bits.
    ms, refs = [model(1), model(2)], [model(1), model(2)]
    opts = [
        SwapAdamW(ms[0].parameters(), lr=0.01, swap_times=3, min_swap_numel=8),
        SwapAdamW(ms[1].parameters(), lr=0.02, swap_times=2, packed=False, defer_offload=True, min_swap_numel=8),
    ]
    ref_opts = [torch.optim.AdamW(refs[0].parameters(), lr=0.01), torch.optim.AdamW(refs[1].parameters(), lr=0.02)]
    g = torch.Generator().manual_seed(5)
    for _step in range(4):
        x = torch.randn(8, 32, generator=g).to(DEVICE)
        for mm, o in zip(ms + refs, opts + ref_opts):
            o.zero_grad()
            mm(x).square().mean().backward()
        opts[1].prefetch()
        for o in opts + ref_opts:
            o.step()
    for k in range(2):
        for a, b in zip(ms[k].parameters(), refs[k].parameters()):
            assert_same_bits(a, b, f"model {k}")
        assert_same_state(opts[k].state_dict(), ref_opts[k].state_dict())
