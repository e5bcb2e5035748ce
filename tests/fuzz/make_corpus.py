#!/usr/bin/env python3
"""Writes the seed corpus of the safetensors fuzz target into corpus/ (committed; rerun after
changing it). Valid files in the layouts real writers produce, and one file per rejection class."""
import json
import pathlib
import struct

OUT = pathlib.Path(__file__).parent / "corpus"


def file(header, data=b"", pad=True):
    h = header if isinstance(header, bytes) else json.dumps(header, separators=(",", ":")).encode()
    if pad:
        h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data


def t(dtype, shape, b, e):
    return {"dtype": dtype, "shape": shape, "data_offsets": [b, e]}


f32 = struct.pack("<4f", 1.0, -2.0, 0.5, 3.0)
seeds = {
    "valid-empty": file({}),
    "valid-metadata-only": file({"__metadata__": {"step": "7", "lr": "0.001"}}),
    "valid-one-f32": file({"w": t("F32", [2, 2], 0, 16)}, f32),
    "valid-mixed": file({"__metadata__": {"step": "7"}, "a": t("F64", [], 0, 8), "c": t("F16", [0], 8, 8),
                         "b": t("U8", [3], 8, 11)}, struct.pack("<d", 1.5) + b"\x01\x02\x03"),
    "valid-all-dtypes": file({"i": t("I64", [1], 0, 8), "d": t("F64", [1], 8, 16), "f": t("F32", [2], 16, 24),
                              "b": t("BF16", [2], 24, 28), "h": t("F16", [1, 2], 28, 32),
                              "u": t("U8", [2, 1], 32, 34)}, bytes(range(34))),
    "valid-unsorted-unaligned": file(b' {"z":{"data_offsets":[0,3],"shape":[3],"dtype":"U8"},'
                                     b'"\\u00e9":{"dtype":"F32","shape":[1],"data_offsets":[3,7]}} \n',
                                     b"abcdefg", pad=False),
    # An optimizer checkpoint matching the slots of the fuzz target's check_checkpoint.
    "valid-checkpoint": file({"__metadata__": {"pipeswap.format": "optimizer_state", "pipeswap.format_version": "1",
                                               "steps": "3"},
                              "state.0.exp_avg": t("F32", [2], 0, 8), "state.0.exp_avg_sq": t("F32", [2], 8, 16),
                              "state.1.exp_avg": t("BF16", [1], 16, 18)}, f32 + b"\x80\x3f"),
    "invalid-short": b"\x08\x00\x00",
    "invalid-length-past-end": struct.pack("<Q", 64) + b"{}",
    "invalid-length-huge": struct.pack("<Q", 2**63) + b"{}",
    "invalid-not-json": file(b"{:}"),
    "invalid-nul": file(b"{}\x00x"),
    "invalid-utf8": file(b'{"\xff":1}'),
    "invalid-array": file([]),
    "invalid-duplicate": file(b'{"a":' + json.dumps(t("U8", [1], 0, 1)).encode() + b',"a":'
                              + json.dumps(t("U8", [1], 1, 2)).encode() + b"}", b"xy"),
    "invalid-dtype": file({"a": t("Q8", [1], 0, 1)}, b"x"),
    "invalid-unsupported-dtype": file({"a": t("I32", [1], 0, 4)}, b"xxxx"),
    "invalid-negative-shape": file({"a": t("U8", [-1], 0, 1)}, b"x"),
    "invalid-overflow": file({"a": t("F32", [2**62, 4], 0, 4)}, b"xxxx"),
    "invalid-size": file({"a": t("F32", [4], 0, 12)}, bytes(12)),
    "invalid-overlap": file({"a": t("U8", [4], 0, 4), "b": t("U8", [4], 2, 6)}, bytes(6)),
    "invalid-gap": file({"a": t("U8", [2], 0, 2), "b": t("U8", [2], 4, 6)}, bytes(6)),
    "invalid-trailing": file({"a": t("U8", [2], 0, 2)}, bytes(5)),
    "invalid-metadata": file({"__metadata__": {"k": 1}}),
    "invalid-deep": file(b'{"a":{"dtype":"U8","shape":[[1]],"data_offsets":[0,1]}}', b"x"),
}

OUT.mkdir(exist_ok=True)
for old in OUT.iterdir():
    old.unlink()
for name, data in seeds.items():
    (OUT / name).write_bytes(data)
print(f"{len(seeds)} seeds, {sum(map(len, seeds.values()))} bytes")
