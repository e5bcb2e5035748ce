"""pipeswap.torch.SwapAdamW in PyTorch Lightning: the one line is the optimizer that
``configure_optimizers`` returns.

The oracle is the same LightningModule returning ``torch.optim.AdamW``. Lightning drives the step
itself (automatic optimization): it calls ``optimizer.step(closure)`` and runs the forward, the
backward and the gradient clipping inside the closure; it moves the optimizer's state to the root
device at setup and after a checkpoint load (``_optimizer_to_device``), and its checkpoints hold
``optimizer.state_dict()``. Every parameter and every state tensor must come out with torch's bits,
and a job resumed from Lightning's own checkpoint (``fit(ckpt_path=...)``) must end where the
uninterrupted job ends.
"""

import os
import warnings

import pytest
import torch
from conftest import DEVICE, assert_same_bits, assert_same_state
from torch import nn

pl = pytest.importorskip("pytorch_lightning")

import pipeswap.torch as pt  # noqa: E402

BATCHES = 3  # per epoch
SWAP = dict(swap_times=2, min_swap_numel=0)  # tiny tensors: swap them all, in two batches


class Tiny(pl.LightningModule):
    def __init__(self, swap):
        super().__init__()
        torch.manual_seed(7)
        self.net = nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 4))
        self.swap = swap

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        kwargs = dict(lr=2e-2, betas=(0.8, 0.95), weight_decay=0.05)
        # The one line: torch.optim.AdamW(...) becomes pipeswap.torch.SwapAdamW(...).
        opt = (
            pt.SwapAdamW(self.parameters(), **kwargs, **SWAP)
            if self.swap
            else torch.optim.AdamW(self.parameters(), **kwargs)
        )
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def loader():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(BATCHES * 4, 8, generator=g)
    y = torch.randn(BATCHES * 4, 4, generator=g)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=4, shuffle=False)


def fit(swap, epochs, ckpt_path=None, save_to=None):
    model = Tiny(swap)
    trainer = pl.Trainer(
        max_epochs=epochs,
        accelerator=DEVICE.type,
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        gradient_clip_val=0.5,
    )
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", ".*does not have many workers.*")
        trainer.fit(model, loader(), ckpt_path=ckpt_path)
    if save_to is not None:
        trainer.save_checkpoint(save_to)
    return model, trainer


def state_of(trainer):
    opt = trainer.optimizers[0]
    return opt.state_dict()


def test_lightning_trains_bit_identically_and_resumes_from_its_checkpoint(tmp_path):
    ref, ref_trainer = fit(False, 2)
    mine, mine_trainer = fit(True, 2)
    assert isinstance(mine_trainer.optimizers[0], pt.SwapAdamW)
    assert mine_trainer.global_step == ref_trainer.global_step == 2 * BATCHES
    assert mine_trainer.optimizers[0].swap_stats()["batches"] == 2  # the state did move
    for (name, a), b in zip(ref.named_parameters(), mine.parameters()):
        assert_same_bits(b, a, name)
    assert_same_state(state_of(mine_trainer), state_of(ref_trainer))

    # One epoch, Lightning's checkpoint, and a new job resumed from it: the same bits as above.
    ckpt = os.path.join(tmp_path, "epoch1.ckpt")
    fit(True, 1, save_to=ckpt)
    saved = torch.load(ckpt, weights_only=False)["optimizer_states"][0]
    assert sorted(saved["state"][0]) == ["exp_avg", "exp_avg_sq", "step"]
    resumed, resumed_trainer = fit(True, 2, ckpt_path=ckpt)
    assert resumed_trainer.global_step == 2 * BATCHES
    for (name, a), b in zip(ref.named_parameters(), resumed.parameters()):
        assert_same_bits(b, a, f"resumed {name}")
    assert_same_state(state_of(resumed_trainer), state_of(ref_trainer), "resumed ")
    assert (
        resumed_trainer.lr_scheduler_configs[0].scheduler.get_last_lr()
        == ref_trainer.lr_scheduler_configs[0].scheduler.get_last_lr()
    )


def test_lightning_checkpoint_of_torch_adamw_resumes_into_swapadamw(tmp_path):
    """A job started with torch.optim.AdamW switches to SwapAdamW at a restart, from its checkpoint."""
    ref, ref_trainer = fit(False, 2)
    ckpt = os.path.join(tmp_path, "adamw.ckpt")
    fit(False, 1, save_to=ckpt)
    resumed, resumed_trainer = fit(True, 2, ckpt_path=ckpt)
    assert isinstance(resumed_trainer.optimizers[0], pt.SwapAdamW)
    for (name, a), b in zip(ref.named_parameters(), resumed.parameters()):
        assert_same_bits(b, a, f"resumed {name}")
    assert_same_state(state_of(resumed_trainer), state_of(ref_trainer), "resumed ")
