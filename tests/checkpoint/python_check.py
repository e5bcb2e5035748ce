#!/usr/bin/env python3
"""Checks optimizer checkpoints against the Python `safetensors` package, both ways.

usage: python_check.py TOOL WORKDIR

1. pipeswap writes (TOOL write): an AdamW checkpoint (F32 state, fp32 masters of bf16 parameters,
   amsgrad) and a checkpoint of an optimizer with BF16 state. safetensors reads them
   (safetensors.numpy.load_file, safe_open, and the low-level deserialize for BF16) and sees
   exactly the tensor names, dtypes, shapes, bytes, values and metadata the runtime held.
   With PyTorch installed, safetensors.torch.load_file is checked too (BF16 included).
2. safetensors writes (safetensors.numpy.save_file, the low-level serializer for BF16) edited
   checkpoints; pipeswap loads them into a fresh optimizer (TOOL reload) and saves what it loaded:
   the values are the edited ones. Files with a missing tensor or a wrong dtype are rejected.

Installs safetensors and numpy with pip when they are missing, and exits 77 (skip) with the reason
when that is impossible (tests/support/pycheck.py).
"""
import json
import os
import shutil
import subprocess
import sys


sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from pycheck import check, failures, require_packages, tool, use_tool  # noqa: E402

require_packages("checkpoint check")

import numpy as np  # noqa: E402
import safetensors  # noqa: E402
import safetensors.numpy as stn  # noqa: E402
from safetensors import safe_open  # noqa: E402

TOOL, WORK = sys.argv[1], sys.argv[2]
use_tool(TOOL)


def bf16_to_f32(raw):
    """BF16 bytes (little-endian) to float32: the high half of an IEEE single."""
    return (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)


def f32_of(values):
    return np.array(values, dtype=np.float64).astype(np.float32)


def same_floats(a, b):
    """Bitwise equality of two float32 arrays (NaNs included)."""
    return a.shape == b.shape and a.view(np.uint32).tobytes() == b.view(np.uint32).tobytes()


def deserialize(path):
    """name -> (dtype code, shape, bytes) through the reference's low-level reader."""
    with open(path, "rb") as f:
        data = f.read()
    out = {}
    for name, t in safetensors.deserialize(data):
        code = {"bfloat16": "BF16", "float32": "F32"}.get(t["dtype"], t["dtype"])
        out[name] = (code, list(t["shape"]), bytes(t["data"]))
    return out


def serialize_raw(tensors, metadata, path):
    """Writes name -> (dtype code, shape, bytes) with the reference's low-level serializer."""
    names = {"BF16": "bfloat16", "F32": "float32"}
    specs, keep = {}, []
    for name, (code, shape, raw) in tensors.items():
        if hasattr(safetensors, "TensorSpec"):
            buf = np.frombuffer(raw, dtype=np.uint8).copy()
            keep.append(buf)
            specs[name] = safetensors.TensorSpec(dtype=names[code], shape=shape, data_ptr=buf.ctypes.data,
                                                 data_len=buf.nbytes)
        else:
            specs[name] = {"dtype": names[code], "shape": shape, "data": raw}
    data = bytes(safetensors.serialize(specs, metadata=metadata))
    with open(path, "wb") as f:
        f.write(data)


def pipeswap_writes_reference_reads():
    r = tool("write", WORK)
    if r.returncode != 0:
        raise SystemExit(f"FAIL: checkpoint_tool write: {r.stdout}{r.stderr}")
    for kind in ("adam", "momentum"):
        path = os.path.join(WORK, kind + ".safetensors")
        with open(os.path.join(WORK, kind + ".json")) as f:
            want = json.load(f)
        with safe_open(path, framework="numpy") as f:
            check(f.metadata() == want["metadata"], f"{kind}: metadata {f.metadata()} != {want['metadata']}")
            check(sorted(f.keys()) == sorted(want["tensors"]), f"{kind}: tensor names")
            for name, t in want["tensors"].items():
                s = f.get_slice(name)
                check(s.get_dtype() == t["dtype"] and list(s.get_shape()) == t["shape"],
                      f"{kind}: {name} dtype/shape {s.get_dtype()} {s.get_shape()}")
        raw = deserialize(path)
        for name, t in want["tensors"].items():
            code, shape, data = raw.get(name, (None, None, b""))
            check(code == t["dtype"] and shape == t["shape"] and data.hex() == t["hex"],
                  f"{kind}: {name} bytes (deserialize)")
            got = bf16_to_f32(data) if code == "BF16" else np.frombuffer(data, dtype="<f4")
            check(same_floats(got, f32_of(t["values"])), f"{kind}: {name} values (deserialize)")
        if kind == "adam":  # numpy has no bfloat16: F32 files only
            arrays = stn.load_file(path)
            for name, t in want["tensors"].items():
                a = arrays[name]
                check(a.dtype == np.float32 and list(a.shape) == t["shape"], f"adam: {name} numpy dtype/shape")
                check(a.tobytes().hex() == t["hex"], f"adam: {name} numpy bytes")
                check(same_floats(a, f32_of(t["values"])), f"adam: {name} numpy values")
        try:
            import torch
            import safetensors.torch as stt
        except ImportError:
            if kind == "adam":
                print("note: PyTorch is not installed; safetensors.torch.load_file not checked")
            continue
        loaded = stt.load_file(path)
        for name, t in want["tensors"].items():
            x = loaded[name]
            want_dtype = torch.bfloat16 if t["dtype"] == "BF16" else torch.float32
            check(x.dtype == want_dtype and list(x.shape) == t["shape"], f"{kind}: {name} torch dtype/shape")
            check(same_floats(x.float().numpy(), f32_of(t["values"])), f"{kind}: {name} torch values")
        print(f"{kind}: safetensors.torch.load_file agrees ({len(loaded)} tensors)")
    print("pipeswap -> safetensors: names, dtypes, shapes, bytes, values and metadata agree")


def reload(kind, src, dst):
    return tool("reload", kind, src, dst)


def reference_writes_pipeswap_reads():
    # AdamW, F32: edit every tensor, write with safetensors.numpy, load into pipeswap, save again.
    src = os.path.join(WORK, "adam.safetensors")
    with safe_open(src, framework="numpy") as f:
        meta = f.metadata()
    arrays = stn.load_file(src)
    edited = {k: (v * np.float32(-0.5) + np.float32(i)).astype(np.float32) for i, (k, v) in
              enumerate(sorted(arrays.items()))}
    p = os.path.join(WORK, "adam_edited.safetensors")
    out = os.path.join(WORK, "adam_reloaded.safetensors")
    stn.save_file(edited, p, metadata=meta)
    r = reload("adam", p, out)
    check(r.returncode == 0, f"pipeswap loads the reference's F32 file: {r.stdout}{r.stderr}")
    if r.returncode == 0:
        back = stn.load_file(out)
        check(sorted(back) == sorted(edited), "adam: reloaded names")
        for k, v in edited.items():
            check(same_floats(back[k], v), f"adam: reloaded {k}")
        with safe_open(out, framework="numpy") as f:
            check(f.metadata() == meta, "adam: reloaded metadata")

    # Rejections: a missing tensor, a tensor of the wrong dtype.
    missing = dict(edited)
    del missing["state.4.exp_avg_sq"]
    stn.save_file(missing, p, metadata=meta)
    r = reload("adam", p, out)
    check(r.returncode == 2 and 'tensor "state.4.exp_avg_sq" is missing' in r.stderr,
          f"pipeswap rejects a missing tensor (exit {r.returncode}: {r.stderr.strip()})")
    wrong = dict(edited)
    wrong["state.0.exp_avg"] = wrong["state.0.exp_avg"].astype(np.float64)
    stn.save_file(wrong, p, metadata=meta)
    r = reload("adam", p, out)
    check(r.returncode == 2 and 'tensor "state.0.exp_avg": dtype F64 does not match' in r.stderr,
          f"pipeswap rejects a wrong dtype (exit {r.returncode}: {r.stderr.strip()})")

    # BF16 state through the low-level serializer: reverse each tensor's elements.
    src = os.path.join(WORK, "momentum.safetensors")
    with safe_open(src, framework="numpy") as f:
        meta = f.metadata()
    tensors = {}
    for name, (code, shape, data) in deserialize(src).items():
        h = np.frombuffer(data, dtype="<u2")[::-1].copy()
        tensors[name] = (code, shape, h.tobytes())
    p = os.path.join(WORK, "momentum_edited.safetensors")
    out = os.path.join(WORK, "momentum_reloaded.safetensors")
    serialize_raw(tensors, meta, p)
    r = reload("momentum", p, out)
    check(r.returncode == 0, f"pipeswap loads the reference's BF16 file: {r.stdout}{r.stderr}")
    if r.returncode == 0:
        check(deserialize(out) == tensors, "momentum: reloaded BF16 tensors")
    print("safetensors -> pipeswap: edited checkpoints load with their values; bad ones are rejected")


def main():
    shutil.rmtree(WORK, ignore_errors=True)
    os.makedirs(WORK)
    print(f"safetensors {safetensors.__version__}, numpy {np.__version__}")
    pipeswap_writes_reference_reads()
    reference_writes_pipeswap_reads()
    if failures:
        print(f"{len(failures)} check(s) failed")
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
