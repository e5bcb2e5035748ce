"""pipeswap.torch.SwapAdamW in torchtitan: the one line is
``--override.imports pipeswap.torch.torchtitan.swap_adamw`` (torchtitan's own override mechanism).

torchtitan's Trainer needs an accelerator (it sets the CUDA device first thing), so here every piece
of it that touches the optimizer runs on the CPU, as the Trainer wires them:

- the job's config from torchtitan's CLI (``ConfigManager.parse_args``, llama3_debugmodel) with the
  override in ``--override.imports``, applied by ``apply_overrides`` as the Trainer applies it;
- the ``OptimizersContainer`` built from that config over two model parts (pipeline stages_per_rank): one
  optimizer per part and optimizer name (AdamW and Adam groups), torchtitan's LR schedulers, its
  per-container step hooks;
- its DCP checkpointer (``CheckpointManager``: model parts, the container's FQN-keyed flat optimizer
  state, LR schedulers, train state) saving after step 3, and a new job loading it.

The oracle is the same job without the override (torch.optim.AdamW/Adam): every parameter and every
flat state entry must be bit-identical, from the uninterrupted job and from the resumed one.
"""

import copy

import pytest
import torch
import torch.distributed as dist
from conftest import DEVICE, assert_same_bits
from torch import nn

pytest.importorskip("torchtitan")

from torch.distributed.checkpoint.stateful import Stateful  # noqa: E402
from torchtitan.components.checkpointer import CheckpointManager  # noqa: E402
from torchtitan.components.optimizer import OptimizersContainer, ParamGroupConfig  # noqa: E402
from torchtitan.config.manager import ConfigManager  # noqa: E402
from torchtitan.config.override import apply_overrides  # noqa: E402

import pipeswap.torch as pt  # noqa: E402
from pipeswap.torch.torchtitan import SwapOptimizersContainer, swap_adamw  # noqa: E402

STEPS, SAVE_AT = 6, 3
TARGET = "pipeswap.torch.torchtitan.swap_adamw"


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(16)
        self.proj = nn.Linear(16, 16)

    def forward(self, x):
        return x + torch.tanh(self.proj(self.norm(x)))


class Part(nn.Module):
    """A pipeline chunk as torchtitan splits a model: ``layers`` keeps the blocks' original FQNs."""

    def __init__(self, blocks):
        super().__init__()
        self.layers = nn.ModuleDict(blocks)

    def forward(self, x):
        for block in self.layers.values():
            x = block(x)
        return x


def model_parts(seed):
    torch.manual_seed(seed)
    blocks = {str(i): Block() for i in range(4)}
    return [Part({k: blocks[k] for k in ("0", "1")}).to(DEVICE), Part({k: blocks[k] for k in ("2", "3")}).to(DEVICE)]


def job_config(implementation, override):
    """The job's config as torchtitan's CLI gives it, with this test's optimizer groups."""
    args = [
        "--module",
        "llama3",
        "--config",
        "llama3_debugmodel",
        "--optimizer.implementation",
        implementation,
        "--lr_scheduler.warmup_steps",
        "2",
    ]
    if override:  # the one line
        args += ["--override.imports", TARGET + '={"swap_times": 2, "min_swap_numel": 0}']
    config = ConfigManager().parse_args(args)
    betas = (0.8, 0.95)
    config.optimizer.param_groups = [  # the norms with Adam, the rest with AdamW (two optimizers per part)
        ParamGroupConfig(
            pattern=r"\.norm\.",
            optimizer_name="Adam",
            optimizer_kwargs={"lr": 1e-2, "betas": betas, "weight_decay": 0.01},
        ),
        ParamGroupConfig(
            pattern=r"\.bias$",
            optimizer_name="AdamW",
            optimizer_kwargs={"lr": 2e-2, "betas": betas, "weight_decay": 0.0},
        ),
        ParamGroupConfig(
            pattern=r".*", optimizer_name="AdamW", optimizer_kwargs={"lr": 2e-2, "betas": betas, "weight_decay": 0.1}
        ),
    ]
    if config.override.imports:
        apply_overrides(config.override, config)  # where Trainer.__init__ applies them
    return config


@pytest.fixture(scope="module", autouse=True)
def one_rank(tmp_path_factory):
    """torchtitan's checkpointer asks for the rank: a process group of one (gloo), as torchrun with one
    process gives the Trainer."""
    store = tmp_path_factory.mktemp("pg") / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


class TrainState(Stateful):
    def __init__(self):
        self.step = 0

    def state_dict(self):
        return {"step": torch.tensor(self.step)}

    def load_state_dict(self, sd):
        self.step = int(sd["step"])


class Job:
    """The Trainer's optimizer wiring: container, LR schedulers and checkpointer over the model parts."""

    def __init__(self, config, folder, seed=1):
        self.parts = model_parts(seed)
        self.optimizers = config.optimizer.build(model_parts=self.parts)
        self.lr_schedulers = config.lr_scheduler.build(optimizers=self.optimizers, training_steps=STEPS)
        self.train_state = TrainState()
        self.pre_hook_calls = 0
        self.optimizers.register_step_pre_hook(lambda *args: setattr(self, "pre_hook_calls", self.pre_hook_calls + 1))
        ckpt = CheckpointManager.Config(enable=True, folder="checkpoint", interval=SAVE_AT)
        self.checkpointer = ckpt.build(
            dataloader=None,
            model_parts=self.parts,
            optimizers=self.optimizers,
            lr_schedulers=self.lr_schedulers,
            states={"train_state": self.train_state},
            sd_adapter=None,
            base_folder=str(folder),
        )

    def train_to(self, last):
        params = [p for part in self.parts for p in part.parameters()]
        while self.train_state.step < last:
            self.train_state.step += 1
            g = torch.Generator().manual_seed(self.train_state.step)
            x = torch.randn(8, 16, generator=g).to(DEVICE)
            self.optimizers.zero_grad()
            out = x
            for part in self.parts:
                out = part(out)
            out.square().mean().backward()
            torch.nn.utils.clip_grad_norm_(params, 0.5)
            self.optimizers.step()
            self.lr_schedulers.step()
            self.checkpointer.save(self.train_state.step, last_step=False)


def assert_same_job(mine, ref, what):
    for part_m, part_r in zip(mine.parts, ref.parts):
        for (name, a), b in zip(part_r.named_parameters(), part_m.parameters()):
            assert_same_bits(b, a, f"{what}{name}")
    sd_m, sd_r = mine.optimizers.state_dict(), ref.optimizers.state_dict()
    assert sorted(sd_m) == sorted(sd_r), f"{what}flat state keys differ"
    for key, v in sd_r.items():
        if isinstance(v, torch.Tensor):
            assert_same_bits(sd_m[key], v, f"{what}{key}")
        else:
            assert sd_m[key] == v, f"{what}{key}: {sd_m[key]!r} against {v!r}"
    assert mine.lr_schedulers.state_dict() == ref.lr_schedulers.state_dict()


@pytest.mark.parametrize("implementation", ["fused", "for-loop"])
def test_torchtitan_override_trains_bit_identically(tmp_path, implementation):
    config = job_config(implementation, override=True)
    assert type(config.optimizer) is SwapOptimizersContainer.Config
    assert config.optimizer.swap == {"swap_times": 2, "min_swap_numel": 0}
    assert config.optimizer.implementation == implementation  # every field copied

    mine = Job(config, tmp_path / "swap")
    ref = Job(job_config(implementation, override=False), tmp_path / "adamw")
    assert type(ref.optimizers) is OptimizersContainer
    # One optimizer per model part and optimizer name, as torchtitan builds them.
    assert [type(o) for o in mine.optimizers] == [pt.SwapAdam, pt.SwapAdamW] * 2
    assert [type(o) for o in ref.optimizers] == [torch.optim.Adam, torch.optim.AdamW] * 2
    assert all(o.swap_settings["swap_times"] == 2 for o in mine.optimizers)
    for o in mine.optimizers:  # the FQNs torchtitan's checkpoints are keyed by
        assert all(len(g["param_names"]) == len(g["params"]) for g in o.param_groups)

    mine.train_to(STEPS)
    ref.train_to(STEPS)
    assert mine.pre_hook_calls == ref.pre_hook_calls == STEPS
    assert all(o.swap_stats()["batches"] >= 1 for o in mine.optimizers)
    assert_same_job(mine, ref, "")


def test_torchtitan_checkpointer_resumes_exactly(tmp_path):
    config = job_config("for-loop", override=True)
    ref = Job(job_config("for-loop", override=False), tmp_path / "adamw")
    ref.train_to(STEPS)
    first = Job(config, tmp_path / "swap")
    first.train_to(SAVE_AT)  # the checkpointer saves after step 3
    first.checkpointer.close()

    # A new job (other initial weights, a fresh container) loads the checkpoint and goes on.
    resumed = Job(copy.deepcopy(config), tmp_path / "swap", seed=99)
    assert resumed.checkpointer.load(step=SAVE_AT)
    assert resumed.train_state.step == SAVE_AT
    resumed.train_to(STEPS)
    assert_same_job(resumed, ref, "resumed ")


def test_torchtitan_override_refuses_what_it_cannot_honour():
    config = job_config("for-loop", override=False).optimizer
    with pytest.raises(TypeError, match=r"unknown swap setting\(s\) \['swap_time'\]"):
        swap_adamw(config, swap_time=2)
    config.implementation = "fused_opt_states_bf16"
    with pytest.raises(ValueError, match="fused_opt_states_bf16"):
        swap_adamw(config)
    with pytest.raises(ValueError, match="fused_opt_states_bf16"):
        SwapOptimizersContainer.Config(param_groups=config.param_groups, implementation="fused_opt_states_bf16").build(
            model_parts=model_parts(1)
        )
