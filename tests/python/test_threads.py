"""Python threads and pipeswap._C: the extension holds the GIL through every call, copies and waits
included, so its C++ code runs in one thread at a time, and the GIL is what guards the device context
(engine, copy streams, pinned pool, budget) that every optimizer and activation swap of a device
shares. Another thread can run only where a call comes back into Python (the update of each batch,
torch's own AdamW, inside step()) and then interleaves at those points.

Here three threads share the CPU's device context: two each train their own model with their own
SwapAdamW, one runs an ActivationSwap through a GPipe order, with the interpreter asked to switch
threads every microsecond. Every result must have the bits of the same work done in one thread.
"""

import sys
import threading

import torch
from conftest import DEVICE, assert_same_bits

import pipeswap.torch as pt

STEPS = 12


# Seeding and a module's initialization use torch's global generator, which the threads share: one
# model is made at a time, so each gets its seed's values whatever the threads' interleaving.
MODEL_LOCK = threading.Lock()


def model(seed):
    with MODEL_LOCK:
        torch.manual_seed(seed)
        return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 8)).to(DEVICE)


def train(seed, opt_cls, log=None, **kw):
    m = model(seed)
    opt = opt_cls(m.parameters(), lr=1e-2, **kw)
    g = torch.Generator().manual_seed(seed)
    for step in range(STEPS):
        x = torch.randn(16, 32, generator=g).to(DEVICE)
        opt.zero_grad()
        m(x).square().mean().backward()
        opt.step()
        if log is not None:
            log.append((seed, step))
    return [p.detach().clone() for p in m.parameters()]


def activations(offload):
    order = pt.schedule_orders("gpipe", 1, 6)[0]
    net = model(7)
    swap = pt.ActivationSwap(DEVICE, order, offload=offload, min_bytes=0)
    xs = [torch.randn(16, 32, generator=torch.Generator().manual_seed(m)).to(DEVICE) for m in range(6)]
    losses = {}
    for _ in range(2):
        for k, s, m in [e for e in swap.order if e is not None and e[0] in ("FWD", "BWD")]:
            if k == "FWD":
                with swap.forward(s, m):
                    losses[m] = net(xs[m]).square().mean()
            else:
                with swap.backward(s, m):
                    losses.pop(m).backward()
        swap.end()
    return [p.grad.clone() for p in net.parameters()], swap.stats()["offloaded_bytes"]


def test_threads_sharing_a_device_context_get_the_bits_of_one_thread():
    want = {seed: train(seed, torch.optim.AdamW) for seed in (1, 2)}
    want_grads, _ = activations(False)
    got, errors, log = {}, [], []
    start = threading.Barrier(3)

    def run(name, work):
        try:
            start.wait()
            got[name] = work()
        except BaseException as e:  # reported below, with the thread's name
            errors.append((name, e))

    jobs = {
        1: lambda: train(1, pt.SwapAdamW, log, swap_times=3, min_swap_numel=1),
        2: lambda: train(2, pt.SwapAdamW, log, swap_times=2, min_swap_numel=1, packed=False),
        "activations": lambda: activations(True),
    }
    threads = [threading.Thread(target=run, args=(name, work), name=f"pipeswap-{name}") for name, work in jobs.items()]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
    finally:
        sys.setswitchinterval(interval)
    assert not any(t.is_alive() for t in threads), "a thread did not finish in 120 s"
    assert not errors, errors
    for seed in (1, 2):
        for i, (a, b) in enumerate(zip(want[seed], got[seed])):
            assert_same_bits(b, a, f"model {seed}, parameter {i}")
    grads, moved = got["activations"]
    assert moved > 0
    for i, (a, b) in enumerate(zip(want_grads, grads)):
        assert_same_bits(b, a, f"activation swap, gradient {i}")
    # The two training threads did run side by side: their steps interleave.
    order = [seed for seed, _ in log]
    assert order != sorted(order) and order != sorted(order, reverse=True), order
