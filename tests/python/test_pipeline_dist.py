"""Activation swap inside torch.distributed.pipelining, across processes: torchrun starts
tests/python/dist/pipeline_worker.py with 2, 3 and 4 ranks on the gloo backend (see its docstring for
what each rank checks), once more with a rank that fails mid-step, and once (2 ranks) for
evaluation between training steps.

Each torchrun has a deadline (subprocess timeout) and each rank a watchdog that dumps its stacks, so a
hang is reported with who waited on what.
"""

import os
import re

import pytest
from conftest import torchrun as run_torchrun

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "dist", "pipeline_worker.py")
DEADLINE = 420  # seconds per torchrun, far above the ~20 s it takes on two cores


def torchrun(nproc, env=None):
    return run_torchrun(WORKER, nproc, env or {}, DEADLINE)


@pytest.mark.parametrize("nproc", [2, 3, 4])
def test_every_gradient_and_parameter_bit_identical_with_activation_swap(nproc):
    r, _ = torchrun(nproc)
    assert r.returncode == 0, f"torchrun failed ({r.returncode}):\n{r.stdout[-4000:]}\n{r.stderr[-8000:]}"
    # The ranks print concurrently into one pipe: their lines may run into each other.
    ok = re.findall(r"OK rank (\d+): (\d+) tensors bit-identical, (\d+) groups swapped", r.stdout)
    assert sorted(int(rank) for rank, _, _ in ok) == list(range(nproc)), r.stdout
    for rank, tensors, groups in ok:  # every rank compared tensors and swapped groups
        assert int(tensors) > 0 and int(groups) > 0, (rank, tensors, groups)


def test_a_failing_rank_takes_the_job_down_naming_its_rank_and_micro_batch():
    r, elapsed = torchrun(3, {"PIPESWAP_TEST_FAIL": "1:2", "PIPESWAP_TEST_WATCHDOG": "120"})
    assert r.returncode != 0
    out = r.stdout + r.stderr
    assert "pipeswap: rank 1, stage 1, micro-batch 2: the forward failed" in out, out[-6000:]
    assert "injected failure" in out
    assert elapsed < 120, f"the job took {elapsed:.0f} s to go down"


def test_evaluation_runs_torch_alone_and_moves_nothing():
    r, _ = torchrun(2, {"PIPESWAP_TEST_EVAL": "1"})
    assert r.returncode == 0, f"torchrun failed ({r.returncode}):\n{r.stdout[-4000:]}\n{r.stderr[-8000:]}"
    ok = re.findall(r"OK rank (\d+): evaluation, (\d+) tensors bit-identical", r.stdout)
    assert sorted(int(rank) for rank, _ in ok) == [0, 1], r.stdout
    assert all(int(n) > 0 for _, n in ok)
