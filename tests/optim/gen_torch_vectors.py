#!/usr/bin/env python3
"""Writes PyTorch reference vectors for pipeswap's Adam/AdamW math (tests/optim/adam_torch_test.cpp).

    python3 tests/optim/gen_torch_vectors.py OUT.json [--dtypes f32,bf16,f16] [--ieee-sqrt] [--no-extras]

The committed files were made with (torch 2.x from PyPI in a venv of Debian's python3, and Debian's
python3-torch 1.13):

    ATEN_CPU_CAPABILITY=default python tests/optim/gen_torch_vectors.py \
        tests/optim/data/torch-2.15.0-default-ieee-sqrt.json --ieee-sqrt
    ATEN_CPU_CAPABILITY=avx2 python tests/optim/gen_torch_vectors.py \
        tests/optim/data/torch-2.15.0-avx2.json --dtypes f32 --no-extras
    ATEN_CPU_CAPABILITY=default /usr/bin/python3 tests/optim/gen_torch_vectors.py \
        tests/optim/data/torch-1.13.0-default.json --dtypes f32 --no-extras

Runs torch.optim.Adam / AdamW (foreach=False, i.e. torch's single-tensor path) on the CPU for a grid
of configurations, from the same initial parameters and gradient sequence, and records the final
parameters and optimizer states bit for bit (float32 as 8 hex digits per element, bf16/f16 as 4).
Also records the per-step scalars torch computes in Python and torch's float -> bf16/f16 rounding of
a set of boundary floats.

Mixed precision is emulated as pipeswap implements it: an fp32 master is optimized by torch (its
gradient is the low-precision gradient widened to fp32) and the low-precision model parameter is
master.to(bf16 | f16) after every step.

torch's CPU kernels come in builds per instruction set; ATEN_CPU_CAPABILITY=default selects the
baseline build, whose vectorized paths contain no fused multiply-add. The capability in effect is
recorded in the output. Deterministic: fixed seeds, no threads involved.
"""
import argparse
import inspect
import json
import math
import os
import platform
import struct
import sys

import torch
import torch.optim.adam as torch_adam

N = 20      # elements per tensor: 16 in ATen's 2x8-wide AVX2 vector loop body, 4 in its scalar tail
STEPS = 4


def f32_hex(t):
    t = t.detach().to(torch.float32).contiguous().view(-1)
    return "".join("%08x" % v for v in t.view(torch.int32).tolist() for v in [v & 0xFFFFFFFF])


def h16_hex(t):
    t = t.detach().contiguous().view(-1)
    return "".join("%04x" % (v & 0xFFFF) for v in t.view(torch.int16).tolist())


def f32_bits(x):
    return struct.unpack("<I", struct.pack("<f", x))[0]


def low_dtype(name):
    return {"bf16": torch.bfloat16, "f16": torch.float16}[name]


def make_inputs(dtype_name, seed):
    """Initial parameter and STEPS gradients, representable in the storage dtype."""
    g = torch.Generator().manual_seed(seed)
    param = torch.randn(N, generator=g, dtype=torch.float32)
    scales = torch.tensor([10.0 ** (k % 7 - 3) for k in range(N)])  # 1e-3 .. 1e3 by element
    grads = [torch.randn(N, generator=g, dtype=torch.float32) * scales for _ in range(STEPS)]
    if dtype_name == "f16":
        tiny, huge = 1e-7, 6.0e4            # an f16 subnormal; near the f16 maximum
        overflow = None
    else:
        tiny, huge = 1e-40, 1e18            # a float subnormal; g*g/1000 stays finite
        overflow = 1e22                     # (1-beta2)*g*g overflows: exp_avg_sq becomes inf
    # Special values in the vector body (index 3) and in the tail (index 18).
    for i in (3, 18):
        grads[0][i] = 0.0
        grads[1][i] = -0.0
        grads[2][i] = tiny
        grads[3][i] = -huge
    grads[1][5] = 1e-30
    grads[2][17] = -tiny
    grads[0][9] = huge
    if overflow is not None:
        grads[1][9] = overflow
    param[7] = 0.0
    param[19] = -1e-38
    if dtype_name != "f32":
        lp = low_dtype(dtype_name)
        param = param.to(lp)
        grads = [x.to(lp) for x in grads]
    return param, grads


def configs():
    out = []
    for lr in (1e-3, 0.1):
        for wd, decoupled in ((0.0, False), (0.01, False), (0.01, True)):
            for amsgrad in (False, True):
                for maximize in (False, True):
                    out.append(dict(lr=lr, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=wd,
                                    amsgrad=amsgrad, maximize=maximize,
                                    decoupled_weight_decay=decoupled))
    # beta1 < 0.5 takes the other branch of ATen's lerp; beta2 = 0.5, eps large, beta1 = 0.
    out.append(dict(lr=0.01, beta1=0.3, beta2=0.99, eps=1e-6, weight_decay=0.1, amsgrad=True,
                    maximize=False, decoupled_weight_decay=True))
    out.append(dict(lr=0.05, beta1=0.0, beta2=0.5, eps=1e-3, weight_decay=0.05, amsgrad=False,
                    maximize=True, decoupled_weight_decay=False))
    return out


def make_optimizer(params, c):
    cls = torch.optim.AdamW if c["decoupled_weight_decay"] else torch.optim.Adam
    kwargs = dict(lr=c["lr"], betas=(c["beta1"], c["beta2"]), eps=c["eps"],
                  weight_decay=c["weight_decay"], amsgrad=c["amsgrad"], maximize=c["maximize"])
    try:
        return cls(params, foreach=False, **kwargs)
    except TypeError:  # torch without the foreach argument
        return cls(params, **kwargs)


def run(index, c, dtype_name, param0, grads):
    master = param0.detach().to(torch.float32).clone().requires_grad_(True)
    opt = make_optimizer([master], c)
    model = None
    for k in range(STEPS):
        master.grad = grads[k].to(torch.float32).clone()
        opt.step()
        if dtype_name != "f32":
            model = master.detach().to(low_dtype(dtype_name))
    st = opt.state[master]
    rec = dict(config=index, dtype=dtype_name, param=f32_hex(master), exp_avg=f32_hex(st["exp_avg"]),
               exp_avg_sq=f32_hex(st["exp_avg_sq"]))
    if c["amsgrad"]:
        rec["max_exp_avg_sq"] = f32_hex(st["max_exp_avg_sq"])
    if model is not None:
        rec["model_param"] = h16_hex(model)
    step = st["step"]
    assert (step.item() if torch.is_tensor(step) else step) == STEPS
    return rec


def bc2_sqrt_expr():
    src = inspect.getsource(torch_adam._single_tensor_adam)
    return "**0.5" if "bias_correction2**0.5" in src.replace(" ", "") else "math.sqrt"


def exp_avg_formula():
    src = inspect.getsource(torch_adam._single_tensor_adam)
    return "lerp" if "exp_avg.lerp_(" in src else "mul_add"


def scalars():
    """Python-side scalars exactly as _single_tensor_adam computes them."""
    use_pow = bc2_sqrt_expr() == "**0.5"
    out = []
    for lr, b1, b2 in ((1e-3, 0.9, 0.999), (0.01, 0.3, 0.99), (3e-4, 0.95, 0.9999)):
        for step in (1, 2, 3, 4, 10, 100, 1270, 2582, 10000, 123456, 1000000, 10000000):
            s = float(step)
            bc1 = 1 - b1 ** s
            bc2 = 1 - b2 ** s
            step_size = lr / bc1
            bc2_sqrt = bc2 ** 0.5 if use_pow else math.sqrt(bc2)
            out.append(dict(lr=lr, beta1=b1, beta2=b2, step=step, bias_correction1=bc1.hex(),
                            bias_correction2=bc2.hex(), step_size=step_size.hex(),
                            bias_correction2_sqrt=bc2_sqrt.hex()))
    return out


def conversions():
    """torch's float -> bf16 / f16 rounding of boundary and random floats (non-NaN)."""
    vals = []
    one = 0x3F800000
    for base in (one, 0x3F810000, 0x7F7F0000, 0x00010000, 0x477FE000, 0x38800000, 0x33800000,
                 0x387FC000, 0x33000000, 0x3F801000, 0x3F803000, 0x477FF000, 0x47800000):
        for d in (-1, 0, 1, 0x0FFF, 0x1000, 0x1001, 0x2000, 0x3000, 0x7FFF, 0x8000, 0x8001, 0x18000):
            vals.append((base + d) & 0x7FFFFFFF)
    g = torch.Generator().manual_seed(7)
    vals += torch.randint(0, 0x7F800000, (200,), generator=g, dtype=torch.int64).tolist()
    vals += [0x7F800000, 0]
    vals += [v | 0x80000000 for v in vals[:40]]
    bits = torch.tensor([v - (1 << 32) if v >= (1 << 31) else v for v in vals], dtype=torch.int32)
    f = bits.view(torch.float32)
    return dict(float="".join("%08x" % v for v in vals), bf16=h16_hex(f.to(torch.bfloat16)),
                f16=h16_hex(f.to(torch.float16)))


def use_ieee_sqrt():
    """Replaces Tensor.sqrt (used by _single_tensor_adam for the denominator) by numpy's IEEE sqrt.

    x86 wheels of torch compute float sqrt with MKL's vsSqrt, which is not correctly rounded (about a
    third of the elements of these vectors come out one ulp off), so without this the recorded
    results mix torch's operation order with MKL's sqrt error.
    """
    import numpy as np

    def ieee_sqrt(self):
        return torch.from_numpy(np.sqrt(self.detach().cpu().numpy()))

    torch.Tensor.sqrt = ieee_sqrt


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--dtypes", default="f32,bf16,f16",
                    help="comma-separated parameter dtypes to run (f32, bf16, f16 with fp32 master)")
    ap.add_argument("--ieee-sqrt", action="store_true",
                    help="compute the denominator's sqrt with numpy (IEEE) instead of torch's kernel")
    ap.add_argument("--no-extras", action="store_true",
                    help="omit the step scalars and the conversion table (keeps a secondary file small)")
    a = ap.parse_args()
    torch.set_num_threads(1)
    if a.ieee_sqrt:
        use_ieee_sqrt()
    if hasattr(torch.backends, "cpu") and hasattr(torch.backends.cpu, "get_cpu_capability"):
        cap = torch.backends.cpu.get_cpu_capability()
    else:  # older torch cannot report it; record what was requested
        cap = os.environ.get("ATEN_CPU_CAPABILITY", "unknown").upper() + " (requested)"
    cfgs = configs()
    inputs, runs = {}, []
    for dt in a.dtypes.split(","):
        seed = {"f32": 1, "bf16": 2, "f16": 3}[dt]
        p0, gs = make_inputs(dt, seed)
        enc = f32_hex if dt == "f32" else h16_hex
        inputs[dt] = dict(param=enc(p0), grads=[enc(x) for x in gs])
        for i, c in enumerate(cfgs):
            if dt == "f16" and not (i % 4 == 1 or i >= 24):  # f16 masters: a subset
                continue
            runs.append(run(i, c, dt, p0, gs))
    doc = dict(
        generator="tests/optim/gen_torch_vectors.py " + " ".join(sys.argv[2:]),
        torch_version=torch.__version__,
        python_version=platform.python_version(),
        machine=platform.machine(),
        cpu_capability=str(cap),
        sqrt="numpy (IEEE)" if a.ieee_sqrt else "torch",
        exp_avg_formula=exp_avg_formula(),
        bias_correction2_sqrt=bc2_sqrt_expr(),
        n=N, steps=STEPS, configs=cfgs, inputs=inputs, runs=runs)
    if not a.no_extras:
        doc["scalars"] = scalars()
        doc["conversions"] = conversions()
    with open(a.out, "w") as fh:
        json.dump(doc, fh, indent=0, separators=(",", ":"))
        fh.write("\n")
    print(f"{a.out}: torch {torch.__version__}, capability {cap}, {len(runs)} runs", file=sys.stderr)


if __name__ == "__main__":
    main()
