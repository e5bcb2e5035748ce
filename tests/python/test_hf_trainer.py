"""pipeswap.torch.SwapAdamW in the Hugging Face Trainer: the one line is the Trainer's
``optimizer_cls_and_kwargs=(pipeswap.torch.SwapAdamW, {...})``.

The oracle is the same Trainer with ``optimizer_cls_and_kwargs=(torch.optim.AdamW, {...})``. The
Trainer builds the optimizer itself (its two parameter groups, with and without weight decay), wraps
it in accelerate's ``AcceleratedOptimizer``, clips the gradients (``max_grad_norm``), steps its
linear schedule, and saves ``optimizer.pt`` with every checkpoint; ``resume_from_checkpoint`` loads
it into a fresh optimizer and skips the batches already seen. Every parameter and every state tensor
must come out with torch's bits, from the uninterrupted job and from the resumed one.
"""

import os
import warnings

import pytest
import torch
from conftest import DEVICE, assert_same_bits, assert_same_state
from torch import nn

transformers = pytest.importorskip("transformers")

import pipeswap.torch as pt  # noqa: E402

STEPS = 6
SWAP = dict(swap_times=2, min_swap_numel=0)  # tiny tensors: swap them all, in two batches


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(11)
        self.net = nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 4))

    def forward(self, x, labels=None):
        out = self.net(x)
        return {"loss": nn.functional.mse_loss(out, labels), "logits": out}


def dataset():
    g = torch.Generator().manual_seed(5)
    return [{"x": torch.randn(8, generator=g), "labels": torch.randn(4, generator=g)} for _ in range(4 * STEPS)]


def train(optimizer_cls, out, resume=None, steps=STEPS):
    kwargs = dict(lr=2e-2, betas=(0.8, 0.95), eps=1e-8)
    if optimizer_cls is pt.SwapAdamW:
        kwargs.update(SWAP)
    args = transformers.TrainingArguments(
        output_dir=str(out),
        per_device_train_batch_size=4,
        max_steps=steps,
        weight_decay=0.05,
        lr_scheduler_type="linear",
        warmup_steps=2,
        max_grad_norm=0.5,
        save_strategy="steps",
        save_steps=3,
        logging_strategy="no",
        report_to=[],
        use_cpu=DEVICE.type == "cpu",
        seed=0,
        data_seed=0,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    model = Tiny()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore")
        trainer = transformers.Trainer(
            model=model, args=args, train_dataset=dataset(), optimizer_cls_and_kwargs=(optimizer_cls, kwargs)
        )  # the one line
        trainer.train(resume_from_checkpoint=resume)
    return model, trainer


def optimizer_of(trainer):
    opt = trainer.optimizer
    return getattr(opt, "optimizer", opt)  # accelerate's AcceleratedOptimizer wraps it


def test_hf_trainer_trains_bit_identically_and_resumes_from_its_checkpoint(tmp_path):
    ref, ref_trainer = train(torch.optim.AdamW, tmp_path / "adamw")
    mine, mine_trainer = train(pt.SwapAdamW, tmp_path / "swap")
    opt = optimizer_of(mine_trainer)
    assert isinstance(opt, pt.SwapAdamW)
    assert len(opt.param_groups) == 2  # the Trainer's decay / no-decay groups
    assert opt.swap_stats()["batches"] == 2  # the state did move
    assert mine_trainer.state.global_step == ref_trainer.state.global_step == STEPS
    for (name, a), b in zip(ref.named_parameters(), mine.parameters()):
        assert_same_bits(b, a, name)
    assert_same_state(optimizer_of(mine_trainer).state_dict(), optimizer_of(ref_trainer).state_dict())

    # The Trainer's own checkpoint after step 3, loaded by a fresh Trainer: the same bits at step 6.
    ckpt = tmp_path / "swap" / "checkpoint-3"
    saved = torch.load(os.path.join(ckpt, "optimizer.pt"), weights_only=True)
    assert sorted(saved["state"]) == list(range(sum(1 for _ in mine.parameters())))
    assert all(int(s["step"]) == 3 for s in saved["state"].values())
    resumed, resumed_trainer = train(pt.SwapAdamW, tmp_path / "swap", resume=str(ckpt))
    assert resumed_trainer.state.global_step == STEPS
    for (name, a), b in zip(ref.named_parameters(), resumed.parameters()):
        assert_same_bits(b, a, f"resumed {name}")
    assert_same_state(optimizer_of(resumed_trainer).state_dict(), optimizer_of(ref_trainer).state_dict(), "resumed ")

    # And the checkpoint of the job with torch.optim.AdamW resumes with SwapAdamW.
    switched, _ = train(pt.SwapAdamW, tmp_path / "adamw", resume=str(tmp_path / "adamw" / "checkpoint-3"))
    for (name, a), b in zip(ref.named_parameters(), switched.parameters()):
        assert_same_bits(b, a, f"switched {name}")
