#!/usr/bin/env python3
"""Prints what the pipeswap._C extension needs to build against the torch this Python imports.

Every path comes from torch itself (torch.utils.cpp_extension, torch.version); Meson reads one
tab-separated line per key (meson.build, the `python` option):

  version   torch.__version__
  inc       torch's include directories
  libdir    torch's library directory
  lib       the libraries to link (c10, torch, torch_cpu, torch_python; c10_cuda, torch_cuda with CUDA)
  cflags    torch's ABI defines (_GLIBCXX_USE_CXX11_ABI, pybind11's build ABI where torch sets one)
  cuda      1 when torch was built with CUDA and the CUDA runtime headers and library were found
  cuda_inc  the CUDA runtime's include directory (torch's nvidia wheel first, then CUDA_HOME)
  cuda_lib  the CUDA runtime library to link (libcudart of the same place)
"""
import glob
import os
import sys
import warnings

warnings.filterwarnings("ignore")
try:
    import torch
    import torch.utils.cpp_extension as ext
except ImportError as e:  # pragma: no cover - reported by meson
    sys.exit(f"pipeswap: the Python package builds against torch, but `import torch` failed with {sys.executable}: {e}")


def paths(fn, cuda):
    try:
        return fn(device_type="cuda" if cuda else "cpu")
    except TypeError:  # torch < 2.6: fn(cuda=...)
        return fn(cuda=cuda)


def emit(key, values):
    print("\t".join([key] + [str(v) for v in values]))


inc = paths(ext.include_paths, False)
libdir = paths(ext.library_paths, False)
libs = ["c10", "torch", "torch_cpu", "torch_python"]
cflags = [f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}"]
for name in ("PYBIND11_COMPILER_TYPE", "PYBIND11_STDLIB", "PYBIND11_BUILD_ABI"):
    value = getattr(torch._C, f"_{name}", None)
    if value:
        cflags.append(f'-D{name}="{value}"')

cuda_inc, cuda_lib = [], []
if torch.version.cuda and os.environ.get("PIPESWAP_TORCH_NO_CUDA", "") in ("", "0"):
    major = torch.version.cuda.split(".")[0]
    site = os.path.dirname(os.path.dirname(torch.__file__))
    roots = sorted(glob.glob(os.path.join(site, "nvidia", f"cu{major}"))) + \
        sorted(glob.glob(os.path.join(site, "nvidia", "cuda_runtime")))
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or getattr(ext, "CUDA_HOME", None) or "/usr/local/cuda"
    roots.append(home)
    for root in roots:
        header = os.path.join(root, "include", "cuda_runtime_api.h")
        if not os.path.isfile(header):
            continue
        found = []
        for sub in ("lib", "lib64", "targets/x86_64-linux/lib", "targets/sbsa-linux/lib"):
            found += sorted(glob.glob(os.path.join(root, sub, f"libcudart.so.{major}*")))
            found += sorted(glob.glob(os.path.join(root, sub, "libcudart.so")))
        if found:
            cuda_inc, cuda_lib = [os.path.join(root, "include")], [found[0]]
            break

emit("version", [torch.__version__])
emit("inc", inc)
emit("libdir", libdir)
emit("lib", libs + (["c10_cuda", "torch_cuda"] if cuda_lib else []))
emit("cflags", cflags)
emit("cuda", [1 if cuda_lib else 0])
emit("cuda_inc", cuda_inc)
emit("cuda_lib", cuda_lib)
