#!/usr/bin/env python3
"""Cross-checks pipeswap's safetensors layer against the reference implementation (the Python
`safetensors` package) in both directions.

usage: python_crosscheck.py TOOL WORKDIR

1. pipeswap writes (TOOL write), safetensors reads: safe_open and safetensors.numpy.load_file see
   the same names, dtypes, shapes, values and metadata; for the same input the reference writer
   (safetensors.numpy.save) produces the same bytes.
2. safetensors writes (safetensors.numpy.save_file, and the low-level serializer for BF16),
   pipeswap reads (TOOL dump, mmap and read modes) and reports the same contents.
3. Both reject the same damaged files.

Installs safetensors and numpy with pip when they are missing, and exits 77 (skip) with the reason
when that is impossible (tests/support/pycheck.py).
"""
import json
import os
import shutil
import struct
import subprocess
import sys


sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from pycheck import check, failures, require_packages, tool, use_tool  # noqa: E402

require_packages("crosscheck")

import numpy as np  # noqa: E402
import safetensors  # noqa: E402
import safetensors.numpy as stn  # noqa: E402
from safetensors import safe_open  # noqa: E402

TOOL, WORK = sys.argv[1], sys.argv[2]
use_tool(TOOL)


NP_DTYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I64": np.int64, "U8": np.uint8}
SHAPES = [(), (0,), (1,), (5,), (2, 3), (4, 0, 2), (2, 1, 3)]
META = {"step": "12", "note": "quote\" back\\ nl\n tab\t \u00e9\u20ac \U0001F600", "empty": ""}


def make_arrays(rng):
    arrays = {}
    for code, dt in NP_DTYPES.items():
        for i, shape in enumerate(SHAPES):
            if np.issubdtype(dt, np.floating):
                a = rng.standard_normal(shape).astype(dt)
            else:
                a = rng.integers(np.iinfo(dt).min, np.iinfo(dt).max, size=shape, dtype=dt,
                                 endpoint=True)
            arrays[f"{code.lower()}.{i}"] = np.ascontiguousarray(a)
    return arrays


def spec_of(arrays, metadata, raw=None):
    tensors = [{"name": k, "dtype": code_of(a.dtype), "shape": list(a.shape), "hex": a.tobytes().hex()}
               for k, a in arrays.items()]
    for k, (code, shape, data) in (raw or {}).items():
        tensors.append({"name": k, "dtype": code, "shape": list(shape), "hex": data.hex()})
    return {"metadata": metadata, "tensors": tensors}


def code_of(dtype):
    for code, dt in NP_DTYPES.items():
        if np.dtype(dt) == dtype:
            return code
    raise ValueError(dtype)


def pipeswap_write(spec, path):
    spec_path = path + ".json"
    with open(spec_path, "w") as f:
        json.dump(spec, f)
    r = tool("write", spec_path, path)
    if r.returncode != 0:
        raise SystemExit(f"FAIL: pipeswap write {path}: {r.stderr}")


def header_of(path):
    with open(path, "rb") as f:
        b = f.read()
    n = struct.unpack("<Q", b[:8])[0]
    return json.loads(b[8:8 + n]), b[8 + n:]


def pipeswap_writes_reference_reads(rng):
    arrays = make_arrays(rng)
    bf16 = rng.standard_normal((3, 4)).astype(np.float32)
    bf16_bytes = (bf16.view(np.uint32) >> 16).astype(np.uint16).tobytes()
    path = os.path.join(WORK, "from_pipeswap.safetensors")
    pipeswap_write(spec_of(arrays, META, {"bf16.0": ("BF16", (3, 4), bf16_bytes)}), path)

    framework = "numpy"
    with safe_open(path, framework) as f:
        check(set(f.keys()) == set(arrays) | {"bf16.0"}, "safe_open: names")
        check(f.metadata() == META, f"safe_open: metadata {f.metadata()!r}")
        for k, a in arrays.items():
            t = f.get_tensor(k)
            check(t.dtype == a.dtype and t.shape == a.shape and np.array_equal(t, a, equal_nan=True)
                  and t.tobytes() == a.tobytes(), f"safe_open: tensor {k}")
        s = f.get_slice("bf16.0")
        check(s.get_dtype() == "BF16" and list(s.get_shape()) == [3, 4], "safe_open: bf16 dtype/shape")
    header, data = header_of(path)
    b, e = header["bf16.0"]["data_offsets"]
    check(data[b:e] == bf16_bytes, "bf16 bytes at their data_offsets")

    # safetensors.numpy.load_file (numpy has no bfloat16, so a file without it).
    path2 = os.path.join(WORK, "from_pipeswap_np.safetensors")
    pipeswap_write(spec_of(arrays, META), path2)
    loaded = stn.load_file(path2)
    check(set(loaded) == set(arrays), "load_file: names")
    for k, a in arrays.items():
        t = loaded.get(k)
        check(t is not None and t.dtype == a.dtype and t.shape == a.shape and t.tobytes() == a.tobytes(),
              f"load_file: tensor {k}")

    # Byte identity with the reference writer (one metadata key: the reference keeps metadata in a
    # hash map, so its order is only defined for a single key).
    for meta in (None, {"step": "12"}, {"note": META["note"]}):
        ref = stn.save(arrays, metadata=meta)
        p = os.path.join(WORK, "same_bytes.safetensors")
        pipeswap_write(spec_of(arrays, meta or {}), p)
        with open(p, "rb") as f:
            mine = f.read()
        check(mine == ref, f"byte-identical to safetensors.numpy.save (metadata {meta!r})")
    print(f"pipeswap -> safetensors: {len(arrays) + 1} tensors checked")


def reference_writes_pipeswap_reads(rng):
    arrays = make_arrays(rng)
    path = os.path.join(WORK, "from_reference.safetensors")
    stn.save_file(arrays, path, metadata=META)
    for mode in ("mmap", "read"):
        r = tool("dump", path, mode)
        check(r.returncode == 0, f"pipeswap dump ({mode}) accepts the reference file: {r.stderr}")
        if r.returncode != 0:
            continue
        d = json.loads(r.stdout)
        check(d["metadata"] == META, f"pipeswap metadata ({mode})")
        check(d["total_size"] == os.path.getsize(path), "pipeswap total_size")
        got = {t["name"]: t for t in d["tensors"]}
        check(set(got) == set(arrays), f"pipeswap names ({mode})")
        for k, a in arrays.items():
            t = got.get(k, {})
            check(t.get("dtype") == code_of(a.dtype) and t.get("shape") == list(a.shape)
                  and t.get("hex") == a.tobytes().hex(), f"pipeswap tensor {k} ({mode})")

    # BF16 through the reference's low-level serializer, where this version offers one.
    raw = bytes(range(24))
    data = None
    try:
        if hasattr(safetensors, "TensorSpec"):
            buf = np.frombuffer(raw, dtype=np.uint8).copy()
            spec = safetensors.TensorSpec(dtype="bfloat16", shape=[3, 4], data_ptr=buf.ctypes.data,
                                          data_len=buf.nbytes)
            data = bytes(safetensors.serialize({"w": spec}, metadata=None))
        else:
            data = bytes(safetensors.serialize({"w": {"dtype": "bfloat16", "shape": [3, 4], "data": raw}}))
    except Exception as e:  # an API this script does not know: the numpy checks above still ran
        print(f"note: BF16 from the reference writer not checked ({type(e).__name__}: {e})")
    if data is not None:
        p = os.path.join(WORK, "bf16_from_reference.safetensors")
        with open(p, "wb") as f:
            f.write(data)
        r = tool("dump", p)
        ok = r.returncode == 0 and json.loads(r.stdout)["tensors"] == [
            {"name": "w", "dtype": "BF16", "shape": [3, 4], "data_offsets": [0, 24], "hex": raw.hex()}]
        check(ok, f"pipeswap reads the reference's BF16 file: {r.stdout}{r.stderr}")
    print(f"safetensors -> pipeswap: {len(arrays)} tensors checked (mmap and read)")


def both_reject_damaged_files():
    src = os.path.join(WORK, "from_reference.safetensors")
    with open(src, "rb") as f:
        good = f.read()
    n = struct.unpack("<Q", good[:8])[0]
    header = json.loads(good[8:8 + n])
    first = min((v["data_offsets"][0], k) for k, v in header.items() if k != "__metadata__"
                and v["data_offsets"][1] > v["data_offsets"][0])[1]
    gap = dict(header)
    gap[first] = dict(header[first], data_offsets=[header[first]["data_offsets"][0] + 1,
                                                   header[first]["data_offsets"][1] + 1])

    def rebuild(h, data):
        hb = json.dumps(h, separators=(",", ":")).encode()
        return struct.pack("<Q", len(hb)) + hb + data

    cases = {
        "truncated by one byte": good[:-1],
        "one trailing byte": good + b"\0",
        "header length one too long": struct.pack("<Q", n + 1) + good[8:],
        "header cut": good[:8 + n // 2],
        "shifted tensor (gap and overrun)": rebuild(gap, good[8 + n:]),
        "wrong dtype size": good.replace(b'"dtype":"F64"', b'"dtype":"F32"', 1),
        "not JSON": struct.pack("<Q", 4) + b"{:}}",
    }
    for name, data in cases.items():
        p = os.path.join(WORK, "damaged.safetensors")
        with open(p, "wb") as f:
            f.write(data)
        try:
            safetensors.deserialize(data)
            ref_rejects = False
        except Exception:
            ref_rejects = True
        r = tool("dump", p)
        check(ref_rejects, f"reference rejects: {name}")
        check(r.returncode == 2 and r.stderr.startswith("safetensors: "),
              f"pipeswap rejects: {name} (exit {r.returncode}: {r.stderr.strip()})")
    print(f"damaged files: {len(cases)} rejected by both")


def main():
    shutil.rmtree(WORK, ignore_errors=True)
    os.makedirs(WORK)
    print(f"safetensors {safetensors.__version__}, numpy {np.__version__}")
    rng = np.random.default_rng(20240601)
    pipeswap_writes_reference_reads(rng)
    reference_writes_pipeswap_reads(rng)
    both_reject_damaged_files()
    if failures:
        print(f"{len(failures)} check(s) failed")
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
