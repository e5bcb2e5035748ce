"""One rank of a framework's multi-rank path, started by torchrun on the gloo backend (2 ranks);
tests/python/test_frameworks_dist.py runs it. PIPESWAP_TEST_FRAMEWORK selects the framework:

``hf``: the Hugging Face Trainer's FSDP2 path. accelerate turns FSDP2 on only on an accelerator, so
the Trainer cannot run it on the CPU. This runs every piece of that path that touches the optimizer,
in the Trainer's order: the model sharded with ``fully_shard`` (per Linear, then the root, as
accelerate's ``fsdp2_prepare_model`` does), the optimizer built after sharding over the DTensor
parameters in the Trainer's two groups (``create_optimizer`` with ``optimizer_cls_and_kwargs``),
gradients clipped on DTensors (``clip_grad_norm_``), and the checkpoint written and read by
accelerate's own ``save_fsdp_model``/``save_fsdp_optimizer`` and
``load_fsdp_model``/``load_fsdp_optimizer`` (sharded, through DCP and
``get_optimizer_state_dict``/``set_optimizer_state_dict``). Besides, accelerate's own FSDP2
``prepare`` of a model and an optimizer built before it (``Accelerator._prepare_fsdp2``:
placeholders in param_groups while it shards, then the sharded DTensor parameters swapped in).

The same job runs with torch.optim.AdamW and with pipeswap.torch.SwapAdamW: every parameter (full
tensor) after the last step must be bit-identical, and so must a job resumed from the checkpoint
written after step SAVE_AT. ``hf_ddp``: the Hugging Face Trainer itself on the 2 CPU ranks
(accelerate's MULTI_CPU, DDP over gloo), with optimizer_cls_and_kwargs, its checkpoint after step
SAVE_AT and a resume from it.

Prints "OK rank R: ..." and exits 0, or raises. A watchdog (faulthandler)
dumps every thread's stack and exits if the rank waits longer than PIPESWAP_TEST_WATCHDOG seconds
(default 240): it says who waited on what.
"""

import faulthandler
import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

import pipeswap.torch as pt

STEPS, SAVE_AT = 6, 3


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(11)
        self.net = nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 4))

    def forward(self, x):
        return self.net(x)


def optimizer(opt_cls, model):
    """The Trainer's create_optimizer: decay and no-decay groups, optimizer_cls_and_kwargs."""
    named = list(model.named_parameters())
    groups = [
        {"params": [p for n, p in named if n.endswith("weight")], "weight_decay": 0.05},
        {"params": [p for n, p in named if not n.endswith("weight")], "weight_decay": 0.0},
    ]
    kwargs = dict(lr=2e-2, betas=(0.8, 0.95))
    if opt_cls is pt.SwapAdamW:
        kwargs.update(swap_times=2, min_swap_numel=0)
    return opt_cls(groups, **kwargs)


def build(opt_cls):
    model = Tiny()
    for m in model.net:
        if isinstance(m, nn.Linear):
            fully_shard(m)
    fully_shard(model)
    return model, optimizer(opt_cls, model)


def train(model, opt, first, last, rank, save=None):
    for step in range(first, last + 1):
        g = torch.Generator().manual_seed(100 * step + rank)
        x, y = torch.randn(4, 8, generator=g), torch.randn(4, 4, generator=g)
        nn.functional.mse_loss(model(x), y).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        opt.step()
        opt.zero_grad()
        if save is not None and step == SAVE_AT:
            save(model, opt)


def full(model):
    return [p.full_tensor().clone() for p in model.parameters()]


def check(results, rank, names):
    compared = 0
    for name in names:
        for i, (a, b) in enumerate(zip(results["adamw"], results[name])):
            if a.dtype != b.dtype or not torch.equal(a.view(torch.int32), b.view(torch.int32)):
                raise AssertionError(
                    f"rank {rank}: {name} parameter {i}: "
                    f"{(a != b).sum().item()} of {a.numel()} elements differ from AdamW's"
                )
            compared += 1
    print(f"OK rank {rank}: {compared} tensors bit-identical", flush=True)


def torchtitan_main():
    from torchtitan.components.checkpointer import CheckpointManager
    from torchtitan.components.optimizer import LRSchedulersContainer, OptimizersContainer, ParamGroupConfig

    from pipeswap.torch.torchtitan import swap_adamw

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    folder = os.environ["PIPESWAP_TEST_DIR"]

    class Part(nn.Module):
        def __init__(self, blocks):
            super().__init__()
            self.layers = nn.ModuleDict(blocks)

        def forward(self, x):
            for block in self.layers.values():
                x = x + torch.tanh(block(x))
            return x

    class Train:
        def __init__(self):
            self.step = 0

        def state_dict(self):
            return {"step": torch.tensor(self.step)}

        def load_state_dict(self, sd):
            self.step = int(sd["step"])

    def job(swap, name, seed=1):
        torch.manual_seed(seed)
        blocks = {str(i): nn.Linear(16, 16) for i in range(4)}
        parts = [Part({k: blocks[k] for k in ("0", "1")}), Part({k: blocks[k] for k in ("2", "3")})]
        for part in parts:
            for block in part.layers.values():
                fully_shard(block)
            fully_shard(part)
        config = OptimizersContainer.Config(
            implementation="for-loop",
            param_groups=[
                ParamGroupConfig(
                    pattern=".*",
                    optimizer_name="AdamW",
                    optimizer_kwargs={"lr": 2e-2, "betas": (0.8, 0.95), "weight_decay": 0.1},
                )
            ],
        )
        if swap:
            config = swap_adamw(config, swap_times=2, min_swap_numel=0)
        optimizers = config.build(model_parts=parts)
        assert len(optimizers) == 2 and all(isinstance(o, pt.SwapAdamW) == swap for o in optimizers)
        lr = LRSchedulersContainer.Config(warmup_steps=2).build(optimizers=optimizers, training_steps=STEPS)
        state = Train()
        ckpt = CheckpointManager.Config(enable=True, folder="checkpoint", interval=SAVE_AT).build(
            dataloader=None,
            model_parts=parts,
            optimizers=optimizers,
            lr_schedulers=lr,
            states={"train_state": state},
            sd_adapter=None,
            base_folder=os.path.join(folder, name),
        )
        return parts, optimizers, lr, state, ckpt

    def train_to(parts, optimizers, lr, state, ckpt, last):
        params = [p for part in parts for p in part.parameters()]
        while state.step < last:
            state.step += 1
            g = torch.Generator().manual_seed(100 * state.step + rank)
            out = torch.randn(4, 16, generator=g)
            optimizers.zero_grad()
            for part in parts:
                out = part(out)
            out.square().mean().backward()
            torch.nn.utils.clip_grad_norm_(params, 0.5)
            optimizers.step()
            lr.step()
            ckpt.save(state.step, last_step=False)

    def full(parts):
        return [p.full_tensor().clone() for part in parts for p in part.parameters()]

    results = {}
    for name, swap in (("adamw", False), ("swap", True)):
        j = job(swap, name)
        train_to(*j, STEPS)
        j[-1].close()
        results[name] = full(j[0])
    j = job(True, "swap", seed=99)  # other initial weights: the checkpoint must bring them back
    assert j[-1].load(step=SAVE_AT) and j[3].step == SAVE_AT
    train_to(*j, STEPS)
    results["resumed_swap"] = full(j[0])
    check(results, rank, ("swap", "resumed_swap"))
    dist.barrier()
    dist.destroy_process_group()


def hf_ddp_main():
    """The Hugging Face Trainer itself on 2 CPU ranks (accelerate's MULTI_CPU: DDP over gloo)."""
    import warnings

    import transformers

    folder = os.environ["PIPESWAP_TEST_DIR"]

    class Model(Tiny):
        def forward(self, x, labels=None):
            out = self.net(x)
            return {"loss": nn.functional.mse_loss(out, labels), "logits": out}

    def data():
        g = torch.Generator().manual_seed(5)
        return [{"x": torch.randn(8, generator=g), "labels": torch.randn(4, generator=g)} for _ in range(4 * STEPS)]

    def job(cls, out, resume=None):
        kwargs = dict(lr=2e-2, betas=(0.8, 0.95))
        if cls is pt.SwapAdamW:
            kwargs.update(swap_times=2, min_swap_numel=0)
        args = transformers.TrainingArguments(
            output_dir=os.path.join(folder, out),
            per_device_train_batch_size=2,
            max_steps=STEPS,
            weight_decay=0.05,
            lr_scheduler_type="linear",
            max_grad_norm=0.5,
            save_strategy="steps",
            save_steps=SAVE_AT,
            logging_strategy="no",
            report_to=[],
            use_cpu=True,
            seed=0,
            dataloader_num_workers=0,
            disable_tqdm=True,
            ddp_backend="gloo",
        )
        model = Model()
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore")
            trainer = transformers.Trainer(
                model=model, args=args, train_dataset=data(), optimizer_cls_and_kwargs=(cls, kwargs)
            )
            trainer.train(resume_from_checkpoint=resume)
        assert trainer.state.global_step == STEPS
        return [p.detach().clone() for p in model.parameters()]

    def resumed(cls, out):
        return job(cls, out, resume=os.path.join(folder, out, f"checkpoint-{SAVE_AT}"))

    # Older Trainers (5.17 among them) load the optimizer state under DDP with map_location set to the
    # rank's device, "cpu:0" on the CPU, which torch.load refuses with this message. That is theirs,
    # not ours, only if torch's own AdamW fails to resume the same way: then the case is skipped, else
    # the error stands.
    cpu_map_location = "restore data location"

    results = {"adamw": job(torch.optim.AdamW, "adamw"), "swap": job(pt.SwapAdamW, "swap")}
    rank = dist.get_rank()
    try:
        results["resumed_swap"] = resumed(pt.SwapAdamW, "swap")
    except RuntimeError as e:
        if cpu_map_location not in str(e):
            raise
        try:
            resumed(torch.optim.AdamW, "adamw")
        except RuntimeError as ref:
            if cpu_map_location not in str(ref):
                raise
            check(results, rank, ("swap",))  # what this Trainer can run is still checked
            if rank == 0:
                print(
                    f"SKIP: transformers {transformers.__version__} cannot resume torch.optim.AdamW either "
                    f"on the CPU under DDP ({ref})",
                    flush=True,
                )
            dist.barrier()
            dist.destroy_process_group()
            return
        raise
    check(results, rank, ("swap", "resumed_swap"))
    dist.barrier()
    dist.destroy_process_group()


def main():
    faulthandler.dump_traceback_later(float(os.environ.get("PIPESWAP_TEST_WATCHDOG", "240")), exit=True)
    framework = os.environ.get("PIPESWAP_TEST_FRAMEWORK", "hf")
    if framework == "torchtitan":
        return torchtitan_main()
    if framework == "hf_ddp":
        return hf_ddp_main()
    from accelerate import Accelerator
    from accelerate.utils import FullyShardedDataParallelPlugin
    from accelerate.utils.fsdp_utils import load_fsdp_model, load_fsdp_optimizer, save_fsdp_model, save_fsdp_optimizer

    accelerator = Accelerator(cpu=True)  # torchrun's environment: gloo, this rank
    rank = dist.get_rank()
    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, state_dict_type="SHARDED_STATE_DICT")
    folder = os.environ["PIPESWAP_TEST_DIR"]

    def saver(sub):
        def save(model, opt):
            out = os.path.join(folder, sub)
            save_fsdp_model(plugin, accelerator, model, out)
            save_fsdp_optimizer(plugin, accelerator, opt, model, out)

        return save

    results = {}
    for name, cls in (("adamw", torch.optim.AdamW), ("swap", pt.SwapAdamW)):
        model, opt = build(cls)
        train(model, opt, 1, STEPS, rank, save=saver(name))
        results[name] = full(model)
        if cls is pt.SwapAdamW:  # the host stores hold this rank's shards' state, not the full tensors'
            local = sum(p.to_local().numel() * p.element_size() for p in model.parameters())
            stored = opt.swap_stats()["host_store_bytes"]
            assert 2 * local <= stored <= 2 * local * 1.01, (rank, stored, 2 * local)
    # accelerate's own FSDP2 preparation of a model and an optimizer built before it (what
    # accelerator.prepare(model, optimizer) runs with FSDP2; on the CPU accelerate does not turn FSDP
    # on, so its plugin is handed to the state here): it wraps layers by size, puts placeholders into
    # param_groups, shards, and swaps the sharded DTensor parameters in.
    accelerator.state.fsdp_plugin = FullyShardedDataParallelPlugin(
        fsdp_version=2, auto_wrap_policy="size_based_wrap", min_num_params=100
    )
    model = Tiny()
    model, opt = accelerator._prepare_fsdp2(model, optimizer(pt.SwapAdamW, model))
    assert all(isinstance(p, DTensor) for g in opt.optimizer.param_groups for p in g["params"])
    train(model, opt, 1, STEPS, rank)
    results["prepared"] = full(model)
    # A new job from SwapAdamW's checkpoint (and one from AdamW's, switching to SwapAdamW).
    for name in ("swap", "adamw"):
        model, opt = build(pt.SwapAdamW)
        load_fsdp_model(plugin, accelerator, model, os.path.join(folder, name))
        load_fsdp_optimizer(plugin, accelerator, opt, model, os.path.join(folder, name))
        train(model, opt, SAVE_AT + 1, STEPS, rank)
        results["resumed_" + name] = full(model)

    check(results, rank, ("swap", "prepared", "resumed_swap", "resumed_adamw"))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    code = 0
    try:
        main()
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    # Out without the interpreter's teardown: once in a loaded run, a rank that had passed every
    # check aborted there ("terminate called without an active exception", a joinable std::thread
    # destroyed; pipeswap starts none) while collecting what gloo, DCP and accelerate left behind.
    os._exit(code)
