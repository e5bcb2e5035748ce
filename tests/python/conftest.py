"""Shared helpers of the pipeswap.torch tests.

The oracle is torch itself: the same parameters, the same gradients and the same options go to
torch.optim.Adam/AdamW and to pipeswap.torch.SwapAdam/SwapAdamW, and every parameter and state
tensor must come out with the same bits.

PIPESWAP_TORCH_DEVICE selects the device (default: cpu). On CUDA the OptimizerInfo inputs include
torch's CUDA-only ones (capturable, tensor betas) and the foreach variants.
"""

import os
import subprocess
import sys
import time

import pytest
import torch

DEVICE = torch.device(os.environ.get("PIPESWAP_TORCH_DEVICE", "cpu"))

if DEVICE.type == "cuda" and not torch.cuda.is_available():  # pragma: no cover
    pytest.exit("PIPESWAP_TORCH_DEVICE asks for CUDA but torch sees no CUDA device", returncode=4)


def bits(t):
    """The tensor's bytes as an integer tensor, so NaNs and signed zeros compare exactly."""
    t = t.detach().to("cpu").contiguous()
    width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    return t.view(width)


def assert_same_bits(a, b, what):
    if a.dtype != b.dtype or a.shape != b.shape:
        raise AssertionError(f"{what}: {a.dtype} {tuple(a.shape)} against {b.dtype} {tuple(b.shape)}")
    diff = (bits(a) != bits(b)).sum().item()
    if diff:
        raise AssertionError(f"{what}: {diff} of {a.numel()} elements differ")


def assert_same_state(swap_sd, torch_sd, what=""):
    """Two state dicts in torch's format hold the same bits (swap's tensors on the CPU)."""
    assert swap_sd["param_groups"] == torch_sd["param_groups"] or _groups_equal(
        swap_sd["param_groups"], torch_sd["param_groups"]
    ), f"{what}param_groups differ"
    assert sorted(swap_sd["state"]) == sorted(torch_sd["state"]), f"{what}state ids differ"
    for i, st in torch_sd["state"].items():
        mine = swap_sd["state"][i]
        assert sorted(mine) == sorted(st), f"{what}state[{i}] keys {sorted(mine)} against {sorted(st)}"
        for k, v in st.items():
            assert mine[k].device.type == "cpu", f"{what}state[{i}][{k}] is not a CPU tensor"
            assert_same_bits(mine[k], v, f"{what}state[{i}][{k}]")


def _groups_equal(a, b):
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if sorted(x) != sorted(y):
            return False
        for k in x:
            u, v = x[k], y[k]
            if isinstance(u, torch.Tensor) or isinstance(v, torch.Tensor):
                if not (isinstance(u, torch.Tensor) and isinstance(v, torch.Tensor)) or not torch.equal(
                    u.cpu(), v.cpu()
                ):
                    return False
            elif isinstance(u, tuple) and any(isinstance(e, torch.Tensor) for e in u):
                if len(u) != len(v) or not all(
                    torch.equal(torch.as_tensor(e).cpu(), torch.as_tensor(f).cpu()) for e, f in zip(u, v)
                ):
                    return False
            elif u != v:
                return False
    return True


def torchrun(worker, nproc, env, deadline):
    """Runs WORKER under torchrun with NPROC ranks (OMP_NUM_THREADS=1 and ENV added to this
    environment) and returns (the completed process, its wall seconds). A run past DEADLINE seconds
    fails the test with the tail of what the ranks printed (each rank's watchdog dumps its stacks)."""
    e = dict(os.environ, OMP_NUM_THREADS="1", **env)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", worker]
    t0 = time.monotonic()
    try:
        r = subprocess.run(cmd, env=e, capture_output=True, text=True, timeout=deadline)
    except subprocess.TimeoutExpired as x:
        out = x.stdout.decode() if isinstance(x.stdout, bytes) else (x.stdout or "")
        err = x.stderr.decode() if isinstance(x.stderr, bytes) else (x.stderr or "")
        pytest.fail(f"torchrun with {nproc} ranks did not finish in {deadline} s:\n{out[-4000:]}\n{err[-8000:]}")
    return r, time.monotonic() - t0


def assert_torchrun_ok(r):
    assert r.returncode == 0, f"torchrun failed ({r.returncode}):\n{r.stdout[-4000:]}\n{r.stderr[-8000:]}"
