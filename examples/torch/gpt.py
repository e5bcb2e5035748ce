"""A small decoder-only transformer cut into pipeline stages, for pipeswap's PyTorch examples and
tests: token embedding, pre-norm blocks (causal self-attention, GELU MLP), final norm and head.

    stages = gpt_stages(vocab=256, dim=64, layers=4, heads=4, stages=2)   # nn.Modules, in order
"""

import torch
from torch import nn
from torch.nn import functional as F


class Block(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, 4 * dim)
        self.down = nn.Linear(4 * dim, dim)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class Stage(nn.Module):
    """Blocks, with the embedding in front on the first stage and the head behind on the last."""

    def __init__(self, vocab, dim, heads, blocks, first, last):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim) if first else None
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(blocks))
        self.norm = nn.LayerNorm(dim) if last else None
        self.head = nn.Linear(dim, vocab, bias=False) if last else None

    def forward(self, x):
        if self.embed is not None:
            x = self.embed(x)
        for b in self.blocks:
            x = b(x)
        if self.head is not None:
            x = self.head(self.norm(x))
        return x


def gpt_stages(vocab, dim, layers, heads, stages, device="cpu", seed=0, dtype=torch.float32):
    """The model as `stages` modules, `layers` blocks spread evenly (the first stages take the rest),
    initialised from `seed` the same way whatever the cut."""
    if layers < stages:
        raise ValueError(f"gpt_stages: {layers} layers cannot fill {stages} stages")
    torch.manual_seed(seed)
    counts = [layers // stages + (1 if i < layers % stages else 0) for i in range(stages)]
    out = [Stage(vocab, dim, heads, n, i == 0, i == stages - 1) for i, n in enumerate(counts)]
    return [m.to(device=device, dtype=dtype) for m in out]


def parameter_count(vocab, dim, layers):
    """Parameters of the whole model (embedding and head untied)."""
    block = 12 * dim * dim + 13 * dim  # qkv, proj, up, down with biases; two LayerNorms
    return 2 * vocab * dim + layers * block + 2 * dim


def loss_fn(logits, target):
    return F.cross_entropy(logits.flatten(0, 1).float(), target.flatten())
