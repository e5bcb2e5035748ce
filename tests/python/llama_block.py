"""torchtitan's Llama block as eager PyTorch, with the module names of its model at the benchmark's
commit (torchtitan/models/llama/model.py, 9dec370), so that its tensor-parallel plan applies as
written: RMSNorm computed in fp32, the rotary embedding as a complex product, grouped-query attention
through scaled_dot_product_attention with K and V repeated to the queries' width (repeat_kv), SwiGLU.
Heads are counted from the projections' local width, as torchtitan's view(bs, seqlen, -1, head_dim),
so a tensor-parallel rank runs its own heads. test_activation_table.py and
dist/tp_activation_worker.py measure what it saves against docs/simulator.md's table.
"""

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, dim, dtype=torch.bfloat16):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim, dtype=dtype))

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5)).type_as(x) * self.weight


def rotary(x, freqs):
    xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(xc * freqs.view(1, x.shape[1], 1, -1)).flatten(3).type_as(x)


def frequencies(seq, head_dim):
    angles = torch.outer(torch.arange(seq).float(), 1.0 / 10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))
    return torch.polar(torch.ones_like(angles), angles)


def linear(i, o):
    return nn.Linear(i, o, bias=False, dtype=torch.bfloat16)


class Attention(nn.Module):
    def __init__(self, dim, heads, kv_heads):
        super().__init__()
        self.head_dim = dim // heads
        self.wq, self.wo = linear(dim, dim), linear(dim, dim)
        self.wk, self.wv = linear(dim, kv_heads * self.head_dim), linear(dim, kv_heads * self.head_dim)

    def forward(self, x, freqs):
        b, s, _ = x.shape
        q = rotary(self.wq(x).view(b, s, -1, self.head_dim), freqs)
        k = rotary(self.wk(x).view(b, s, -1, self.head_dim), freqs)
        v = self.wv(x).view(b, s, -1, self.head_dim)
        rep = q.shape[2] // k.shape[2]
        if rep > 1:  # torchtitan's repeat_kv: K and V copied to the queries' width
            k = k.unsqueeze(3).expand(b, s, k.shape[2], rep, self.head_dim).flatten(2, 3)
            v = v.unsqueeze(3).expand(b, s, v.shape[2], rep, self.head_dim).flatten(2, 3)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        return self.wo(o.transpose(1, 2).contiguous().view(b, s, -1))


class FeedForward(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.w1, self.w2, self.w3 = linear(dim, hidden), linear(hidden, dim), linear(dim, hidden)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, dim, heads, kv_heads, hidden):
        super().__init__()
        torch.manual_seed(0)
        self.attention_norm, self.attention = RMSNorm(dim), Attention(dim, heads, kv_heads)
        self.ffn_norm, self.feed_forward = RMSNorm(dim), FeedForward(dim, hidden)

    def forward(self, x, freqs):
        h = x + self.attention(self.attention_norm(x), freqs)
        return h + self.feed_forward(self.ffn_norm(h))
