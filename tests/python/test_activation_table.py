"""The simulator's table of saved activations (docs/simulator.md, "Activations"; sim/model.hpp,
layer_activations) against what PyTorch's autograd saves for a Llama layer run as eager PyTorch
(`model.fused_kernels: false`), byte for byte: with no recomputation, and under torchtitan's
per-operation selective checkpointing (`model.recompute: "op"`).

The layer is torchtitan's Llama block as eager code (llama_block.py), in bf16, its attention run by
the CPU's flash attention. The bytes are every distinct storage that the autograd graph
holds for the backward, less the parameters and the rotary embedding's constant frequencies. The
C++ tests pin the simulator to the same table (tests/sim/model_test.cpp), so this checks the model
against PyTorch.
"""

import gc
import json
import os
import re
import weakref
from collections import defaultdict

import pytest
import torch
import torch.nn.functional as F
from conftest import DEVICE, assert_torchrun_ok
from conftest import torchrun as run_torchrun
from llama_block import TransformerBlock, frequencies
from storages import Storages
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

B, S, H, HEADS, F_HIDDEN = 2, 96, 256, 4, 512
HEAD_DIM = H // HEADS
E = 2  # bf16


class Layer(TransformerBlock):
    """The block at this file's sizes, its input the only argument (the frequencies are its own)."""

    def __init__(self, kv_heads):
        super().__init__(H, HEADS, kv_heads, F_HIDDEN)
        self.freqs = frequencies(S, HEAD_DIM)

    def forward(self, x):
        return super().forward(x, self.freqs)


def saved_by_autograd(layer):
    """Bytes of the distinct storages the layer's autograd graph saves, and their count, less the
    parameters and the constant frequencies."""
    x = torch.randn(B, S, H, dtype=torch.bfloat16, requires_grad=True)
    out = layer(x)
    skip = {p.untyped_storage().data_ptr() for p in layer.parameters()}
    skip.add(layer.freqs.untyped_storage().data_ptr())
    storages, stack, seen = {}, [out.grad_fn], set()
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        for name in dir(node):
            if not name.startswith("_saved_"):
                continue
            value = getattr(node, name)
            for t in value if isinstance(value, (tuple, list)) else [value]:
                if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in skip:
                    storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        stack.extend(n for n, _ in node.next_functions)
    return sum(storages.values()), len(storages)


def table(kv_heads):
    """docs/simulator.md's rows for one layer, no recomputation, eager kernels (tp 1, so T' = T)."""
    T, hs, kvs, f = B * S, H, kv_heads * HEAD_DIM, F_HIDDEN
    rows = {
        "attn_norm: input in fp32 and normalized before the weight": (4 + E) * T * H,
        "attn.qkv: input (the norm's output)": E * T * H,
        "core attention: Q": E * T * hs,
        "core attention: K, V": 2 * E * T * kvs,
        "core attention: output": E * T * hs,
        "core attention: log-sum-exp (fp32)": 4 * B * HEADS * S,
        "mlp_norm: input in fp32 and normalized before the weight": (4 + E) * T * H,
        "mlp.gate/up: input (the norm's output)": E * T * H,
        "SwiGLU: gate and up outputs": 2 * E * T * f,
        "SwiGLU: SiLU output (eager)": E * T * f,
        "mlp.down: input": E * T * f,
    }
    return sum(rows.values())


ROW_RECIPROCALS = 2 * 4 * B * S  # each norm's per-row fp32 reciprocal: not in the table


def test_multi_head_attention_saves_exactly_the_table():
    got, count = saved_by_autograd(Layer(kv_heads=HEADS))
    assert got == table(HEADS) + ROW_RECIPROCALS
    # the table's eleven rows as fifteen tensors (each norm's two, K and V, gate and up) and the two
    # reciprocals, each stored once
    assert count == 17


def test_repeated_kv_heads_save_k_and_v_at_the_queries_width():
    # Grouped-query attention written as torchtitan's repeat_kv saves K and V repeated to h each: 2·e·T·(h −
    # kv·d) beyond the table, which counts them at kv·d as attention that groups natively does.
    got, _ = saved_by_autograd(Layer(kv_heads=HEADS // 2))
    assert got == table(HEADS // 2) + 2 * E * B * S * (H - HEADS // 2 * HEAD_DIM) + ROW_RECIPROCALS


def per_operation_policy():
    """torchtitan's "op" policy at the benchmark's commit (torchtitan/parallelisms/parallelize_llama.py,
    9dec370): save the attention's outputs and every other matmul's, counted per layer in forward order,
    recompute the rest. The CPU's flash attention operation stands for CUDA's."""
    save = {torch.ops.aten.mm.default, torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default}
    count = defaultdict(int)

    def policy(ctx, func, *args, **kwargs):
        key = "recompute" if ctx.is_recompute else "forward"
        if func == torch.ops.aten.mm.default:
            count[key] += 1
        keep = func in save and not (func == torch.ops.aten.mm.default and count[key] % 2 == 0)
        return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


def test_the_per_operation_policy_keeps_the_op_rows():
    # The "op" rows besides the checkpoint's input (which the caller holds): q, v, the attention's output
    # and log-sum-exp, the gate's output and the down projection's.
    for kv_heads in (HEADS, HEADS // 2):
        layer = Layer(kv_heads)
        x = torch.randn(B, S, H, dtype=torch.bfloat16, requires_grad=True)
        made = Storages()
        with made:
            out = checkpoint(layer, x, use_reentrant=False, context_fn=per_operation_policy, preserve_rng_state=False)
        skip = {p.untyped_storage().data_ptr() for p in layer.parameters()}
        skip |= {t.untyped_storage().data_ptr() for t in (layer.freqs, x, out)}
        T, kvs = B * S, kv_heads * HEAD_DIM
        rows = E * T * H + E * T * kvs + E * T * H + 4 * B * HEADS * S + E * T * F_HIDDEN + E * T * H
        assert made.alive(skip) == rows, kv_heads
        # the same count finds the whole table when nothing is recomputed
        made = Storages()
        with made:
            out = layer(x)
        skip.add(out.untyped_storage().data_ptr())
        assert made.alive(skip) == table(kv_heads) + 2 * E * B * S * (H - kvs) + ROW_RECIPROCALS, kv_heads


class PeakStorages(TorchDispatchMode):
    """The bytes of the storages operations write, alive at once: now and at their peak."""

    def __init__(self, skip):
        super().__init__()
        self.skip, self.sizes, self.refs, self.now, self.peak = skip, {}, {}, 0, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for x in tree_leaves(out):
            if not isinstance(x, torch.Tensor):
                continue
            st = x.untyped_storage()
            p = st.data_ptr()
            if p in self.sizes or p in self.skip or st.nbytes() == 0:
                continue
            self.sizes[p] = st.nbytes()
            self.now += st.nbytes()
            self.peak = max(self.peak, self.now)

            def freed(_, p=p):
                self.now -= self.sizes.pop(p)

            self.refs[p] = weakref.ref(st, freed)
        return out


def test_pytorch_s_cross_entropy_on_fp32_logits_holds_4_bytes_per_logit_and_peaks_at_12():
    # docs/simulator.md ("Calibration", memory): the model's head keeps an fp32 softmax, 4 bytes per
    # logit element, as torchtitan's loss holds after its forward; its backward peaks at 12 (the saved
    # log-softmax and two fp32 gradients), which the model does not charge.
    T, V = 512, 4096
    hidden = torch.randn(T, 64, dtype=torch.bfloat16, requires_grad=True)
    weight = torch.randn(V, 64, dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, V, (T,))
    mode = PeakStorages({t.untyped_storage().data_ptr() for t in (hidden, weight, labels)})
    with mode:
        logits = hidden @ weight.t()
        loss = F.cross_entropy(logits.float(), labels)
        del logits
        gc.collect()
        after_forward = mode.now
        mode.peak = mode.now
        loss.backward()
    small = 64 * 1024  # the loss, its scalars, and the gradients of the 64-wide operands
    assert 4 * T * V <= after_forward < 4 * T * V + small
    assert 12 * T * V <= mode.peak < 12 * T * V + 2 * hidden.numel() * 4 + weight.numel() * 4 + small


WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "dist", "tp_activation_worker.py")


@pytest.mark.skipif(DEVICE.type != "cpu", reason="tensor parallelism over gloo on the CPU")
def test_dtensor_tensor_parallelism_saves_the_gathered_inputs_and_its_loss_peaks_at_16_bytes_per_logit():
    # docs/simulator.md ("Activations", "Calibration"): under torchtitan's tensor-parallel plan on 2
    # ranks (dist/tp_activation_worker.py), the column-parallel linears keep the all-gathered input,
    # e·T·h (parallel.save_gathered_inputs), where Megatron keeps the sequence shard e·T'·h; a fully
    # recomputed block keeps nothing beyond its input; and PyTorch's cross entropy on logits split
    # over the vocabulary (loss_parallel) holds 12 bytes per logit element in its backward beside the
    # saved 4 (model.loss "pytorch" with tp > 1), against 8 without tensor parallelism (above).
    r, _ = run_torchrun(WORKER, 2, {}, 120)
    assert_torchrun_ok(r)
    # Each rank's result is a flat JSON object; the two ranks share torchrun's stdout, where one line
    # can land inside the other's ("RESULT rank 0 {...}RESULT rank 1 {...}"): match each object alone.
    results = [json.loads(m) for m in re.findall(r"RESULT rank \d+ (\{[^{}]*\})", r.stdout)]
    assert len(results) == 2 and results[0] == results[1], r.stdout[-2000:]
    got = results[0]
    t, b, s, h, heads, kv_heads, f, v = (got[k] for k in ("t", "B", "S", "H", "heads", "kv_heads", "f", "V"))
    T, Tr, hs, fs = b * s, b * s // t, h // t, f // t
    rows = {
        "attn_norm and mlp_norm: input in fp32 and normalized before the weight": 2 * (4 + E) * Tr * h,
        "attn.qkv and mlp.gate/up: the gathered input, e·T·h (Megatron: e·T'·h)": 2 * E * T * h,
        "core attention: Q, and K and V repeated to the queries' width": 3 * E * T * hs,
        "core attention: output": E * T * hs,
        "core attention: log-sum-exp (fp32)": 4 * b * (heads // t) * s,
        "SwiGLU: gate and up outputs, SiLU output, mlp.down's input": 4 * E * T * fs,
    }
    assert kv_heads < heads  # K and V are counted at the queries' width: repeat_kv
    assert got["block"] == sum(rows.values()) + 2 * 4 * Tr  # and the norms' per-row reciprocals
    assert got["full"] == 0
    assert got["head"] == (4 + E) * Tr * h + 4 * Tr + E * T * h  # the final norm; the gathered input
    n, small = T * v // t, 64 * T  # the device's logits; the loss's per-row tensors and scalars
    assert 4 * n <= got["loss_saved"] < 4 * n + small
    # its forward: the fp32 copy, the shifted logits and their exp beside the bf16 logits (14 in all)
    assert 12 * n <= got["loss_forward_peak"] < 12 * n + small
    # its backward: zeros with the targets' −1, exp(log-softmax) and their sum beside the saved 4
    assert 12 * n <= got["loss_backward_peak"] < 12 * n + small
