"""One rank of the check of what PyTorch's DTensor tensor parallelism saves (docs/simulator.md,
"Activations"; the simulator's parallel.save_gathered_inputs and model.loss "pytorch" with tp > 1),
started by torchrun on the gloo backend (CPU); tests/python/test_activation_table.py runs it with 2
processes, so t = 2.

torchtitan's Llama block (llama_block.py) and its final norm and output layer take torchtitan's
tensor-parallel plan at the benchmark's commit (torchtitan/parallelisms/parallelize_llama.py,
9dec370: sequence parallelism, the block's inputs redistributed to Replicate before q/k/v and w1/w3,
the output layer column-parallel with the logits split over the vocabulary) and the rank measures, in
bf16 eager PyTorch:

  block   the storages alive after the block's forward, beyond its input, output and parameters
  full    the same under torch.distributed's checkpoint_wrapper (torchtitan's full recomputation)
  head    the same for the final norm and the output layer, beyond the logits
  loss    PyTorch's cross entropy on the fp32 logits under loss_parallel(): the bytes alive after
          its forward, and the peak of all allocations (torch.profiler's) in its forward, with the
          bf16 logits held, and in its backward, after the logits are deleted, each above its start

and prints one line "RESULT rank R {json}" with the bytes and the sizes they are checked against.
A watchdog (faulthandler) dumps every thread's stack and exits if the rank runs longer than
PIPESWAP_TEST_WATCHDOG seconds (default 120): it says who waited on what.
"""

import faulthandler
import gc
import json
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    loss_parallel,
    parallelize_module,
)
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from llama_block import RMSNorm, TransformerBlock, frequencies, linear  # noqa: E402
from storages import Storages, ptr  # noqa: E402

B, S, H, HEADS, KV_HEADS, F_HIDDEN, VOCAB = 2, 64, 256, 8, 4, 768, 1024


def allocated_peak(fn):
    """The peak of every CPU allocation while fn runs, above what was allocated at its start."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    now = peak = 0
    for e in sorted(events, key=lambda e: e.start_ns()):
        now += e.nbytes()
        peak = max(peak, now)
    return peak


def block_plan():
    return {
        "attention_norm": SequenceParallel(),
        "attention": PrepareModuleInput(input_layouts=(Shard(1), None), desired_input_layouts=(Replicate(), None)),
        "attention.wq": ColwiseParallel(),
        "attention.wk": ColwiseParallel(),
        "attention.wv": ColwiseParallel(),
        "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
        "ffn_norm": SequenceParallel(),
        "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        "feed_forward.w1": ColwiseParallel(),
        "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
        "feed_forward.w3": ColwiseParallel(),
    }


def saved_by(module, x, *args):
    """Bytes alive after module(x, *args) that the forward made, beyond its output and parameters."""
    made = Storages()
    with made:
        out = module(x, *args)
    skip = {ptr(p) for p in module.parameters()} | {ptr(x), ptr(out)} | {ptr(a) for a in args}
    return made.alive(skip), out


class Head(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(1)
        self.norm, self.output = RMSNorm(H), linear(H, VOCAB)

    def forward(self, x):
        return self.output(self.norm(x))


def main():
    faulthandler.enable()
    faulthandler.dump_traceback_later(float(os.environ.get("PIPESWAP_TEST_WATCHDOG", "120")), exit=True)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank, t = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (t,))
    freqs = frequencies(S, H // HEADS)
    torch.manual_seed(2)
    x_full = torch.randn(B, S, H, dtype=torch.bfloat16)
    result = {"t": t, "B": B, "S": S, "H": H, "heads": HEADS, "kv_heads": KV_HEADS, "f": F_HIDDEN, "V": VOCAB}

    block = parallelize_module(TransformerBlock(H, HEADS, KV_HEADS, F_HIDDEN), mesh, block_plan())
    # the block's input as torchtitan passes it: the local sequence shard, a plain tensor
    x = x_full.chunk(t, dim=1)[rank].clone().requires_grad_()
    result["block"], _ = saved_by(block, x, freqs)

    full = checkpoint_wrapper(
        parallelize_module(TransformerBlock(H, HEADS, KV_HEADS, F_HIDDEN), mesh, block_plan()),
        preserve_rng_state=False,
    )
    result["full"], out = saved_by(full, x, freqs)
    out.sum().backward()  # the checkpoint runs its backward
    assert x.grad is not None

    head = parallelize_module(
        Head(),
        mesh,
        {
            "norm": SequenceParallel(),
            "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False),
        },
    )
    h = x_full.chunk(t, dim=1)[rank].clone().requires_grad_()
    held = {}
    result["head"], held["pred"] = saved_by(head, h)

    labels = distribute_tensor(torch.randint(0, VOCAB, (B, S)), mesh, [Replicate()])
    with loss_parallel():

        def forward():  # torchtitan's loss_fn
            held["loss"] = F.cross_entropy(held["pred"].flatten(0, 1).float(), labels.flatten(0, 1))

        made = Storages()
        with made:
            result["loss_forward_peak"] = allocated_peak(forward)
        result["loss_saved"] = made.alive({ptr(held["loss"]), ptr(held["pred"])})
        del held["pred"]  # torchtitan deletes the logits before the backward
        gc.collect()
        result["loss_backward_peak"] = allocated_peak(lambda: held.pop("loss").backward())
    assert h.grad is not None
    print(f"RESULT rank {rank} {json.dumps(result)}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
