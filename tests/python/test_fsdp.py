"""SwapAdamW under FSDP2 and torch.distributed.checkpoint, across processes: torchrun starts
tests/python/dist/fsdp_worker.py on the gloo backend (see its docstring for what each rank checks).

- 2 ranks, then 4: five FSDP2 setups (1-D mesh; reshard_after_forward=False with a MixedPrecisionPolicy;
  gradient accumulation with set_requires_gradient_sync and clip_grad_norm_; HSDP on a 2-D mesh;
  FSDP + TP on a 2-D mesh) bit-identical to torch.optim.AdamW, with host stores of exactly the local
  shards' state, and the DCP round trips (nested, flattened, full + cpu_offload, dcp.save/dcp.load);
  ZeroRedundancyOptimizer(optimizer_class=SwapAdamW) consolidates, reloads and resumes exactly
  (those two on 2 ranks).
- 2 and 4 ranks: a job killed after 3 steps resumes from its DCP checkpoint and matches the
  uninterrupted torch.optim.AdamW run bit for bit over 10 more steps.

Each torchrun has a deadline (subprocess timeout) and each rank a watchdog that dumps its stacks.
"""

import os
import re

import pytest
from conftest import DEVICE, assert_torchrun_ok
from conftest import torchrun as run_torchrun

# The ranks run on the CPU over gloo whatever the device; on a GPU machine
# bench/gpu/torch_fsdp_check.py runs FSDP2 and DCP on CUDA instead.
pytestmark = pytest.mark.skipif(
    DEVICE.type != "cpu", reason="FSDP2 over gloo on the CPU; bench/gpu/torch_fsdp_check.py covers CUDA"
)

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "dist", "fsdp_worker.py")
CASES = ("1d", "mp_keep", "accum_clip", "hsdp", "fsdp_tp")
DEADLINE = 300  # seconds per torchrun, far above the ~10-30 s each takes on two cores


def torchrun(nproc, env):
    r, _ = run_torchrun(WORKER, nproc, env, DEADLINE)
    assert_torchrun_ok(r)
    return r.stdout


def ranks_ok(out, what, nproc):
    found = re.findall(r"OK rank (\d+): " + re.escape(what) + r": (\d+) tensors bit-identical", out)
    assert sorted(int(r) for r, _ in found) == list(range(nproc)), f"{what}:\n{out}"
    assert all(int(n) > 0 for _, n in found), found


def resume(nproc, ckpt):
    out = torchrun(nproc, {"PIPESWAP_TEST_CASES": "", "PIPESWAP_TEST_RESUME": ckpt})
    found = re.findall(r"OK rank (\d+): resumed: (\d+) tensors bit-identical over 10 steps", out)
    assert sorted(int(r) for r, _ in found) == list(range(nproc)), out


def test_two_ranks_fsdp2_setups_dcp_zero_and_a_killed_job_resumes(tmp_path):
    ckpt = str(tmp_path / "ckpt")
    out = torchrun(
        2, {"PIPESWAP_TEST_DCP": str(tmp_path / "dcp"), "PIPESWAP_TEST_ZERO": str(tmp_path), "PIPESWAP_TEST_SAVE": ckpt}
    )
    for case in CASES + ("dcp", "zero"):
        ranks_ok(out, case, 2)
    assert len(re.findall(r"OK rank \d+: saved after 3 steps", out)) == 2, out  # then killed
    resume(2, ckpt)


def test_four_ranks_fsdp2_setups_and_a_killed_job_resumes(tmp_path):
    # The 2-D meshes are 2 x 2 here (HSDP, FSDP + TP); the saved job runs HSDP.
    ckpt = str(tmp_path / "ckpt")
    out = torchrun(4, {"PIPESWAP_TEST_SAVE": ckpt})
    for case in CASES:
        ranks_ok(out, case, 4)
    assert len(re.findall(r"OK rank \d+: saved after 3 steps", out)) == 4, out
    resume(4, ckpt)
