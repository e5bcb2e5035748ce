#!/usr/bin/env python3
"""Time compiling a one-line TU per public header, and the runtime TU, at -O0.

    python3 scripts/compile_times.py [--cxx g++] [--repeat 3] [--only PATTERN] [--markdown] [--instructions]

Each TU is `#include <pipeswap/HEADER>`, compiled with `-std=c++20 -O0 -c` (no link). The runtime TU
is scripts/compile_time/runtime_tu.cpp: optimizer_swap<adamw<B>> over a user-written backend, one
step(); it is timed again with -DRUNTIME_TU_EXTERN (PIPESWAP_EXTERN_OPTIMIZER_SWAP and
PIPESWAP_EXTERN_ADAM from <pipeswap/swap/instantiate.hpp>, as an engine's other TUs would compile it)
and with -DRUNTIME_TU_INSTANTIATE (the one TU with the matching explicit instantiations). The
figure is the compiler's CPU time (user + system, from getrusage), the least of --repeat runs, so
that other work on a shared machine inflates it as little as possible. Headers that need the CUDA Toolkit are skipped when it is not found; *.cuh need nvcc and are skipped.

--instructions reports instead the instructions the compiler executes (driver, cc1plus and
assembler, counted by valgrind's callgrind; about 40 times slower). Unlike CPU time, the count does
not depend on the machine's load: two trees compare in one run each.
"""
import argparse
import os
import pathlib
import resource
import subprocess
import sys
import tempfile

root = pathlib.Path(__file__).resolve().parent.parent
include = root / "include"
# The simulator, the pipeswap command's own headers (<pipeswap/sim...>), outside the library's tree.
sim_include = root / "examples" / "pipeswap" / "include"


def cpu_seconds(cmd):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode != 0:
        sys.exit(f"compile failed: {' '.join(cmd)}\n{r.stderr[-4000:]}")
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def instructions(cmd, tmp):
    out = pathlib.Path(tmp) / "callgrind.%p"
    r = subprocess.run(["valgrind", "--tool=callgrind", "--trace-children=yes", "--cache-sim=no",
                        "--branch-sim=no", f"--callgrind-out-file={out}", *cmd],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        sys.exit(f"compile failed: {' '.join(cmd)}\n{r.stderr[-4000:]}")
    counts = [int(line.split(":")[-1]) for line in r.stderr.splitlines() if "Collected :" in line]
    if not counts:
        sys.exit("valgrind reported no instruction count (is valgrind installed?)")
    return sum(counts)


def cuda_include():
    for d in [os.environ.get("CUDA_PATH", ""), "/usr/local/cuda"]:
        if d and (pathlib.Path(d) / "include" / "cuda_runtime_api.h").is_file():
            return str(pathlib.Path(d) / "include")
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cxx", default=os.environ.get("CXX", "g++"))
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--only", default="", help="time only headers whose path contains this")
    ap.add_argument("--markdown", action="store_true", help="print a Markdown table")
    ap.add_argument("--instructions", action="store_true",
                    help="count the compiler's instructions (valgrind) instead of timing it")
    args = ap.parse_args()

    headers = sorted(p.relative_to(d).as_posix() for d in (include, sim_include) for p in d.rglob("*.hpp")
                     if "detail" not in p.relative_to(d).parts)
    cuda_inc = cuda_include()
    base = [args.cxx, "-std=c++20", "-O0", "-c", "-o", os.devnull, "-I", str(include), "-I", str(sim_include)]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tus = []
        for h in headers:
            if args.only not in h:
                continue
            extra = []
            if h.startswith(("pipeswap/backend/cuda", "pipeswap/optim/cuda")):
                if cuda_inc is None:
                    continue
                extra = ["-I", cuda_inc]
            tu = pathlib.Path(tmp) / (h.replace("/", "_") + ".cpp")
            tu.write_text(f"#include <{h}>\n")
            tus.append((f"<{h}>", [*base, *extra, str(tu)]))
        if args.only in "runtime":
            rt = str(root / "scripts" / "compile_time" / "runtime_tu.cpp")
            tus.append(("runtime TU (optimizer_swap<adamw<B>>, step)", [*base, rt]))
            tus.append(("runtime TU with PIPESWAP_EXTERN_OPTIMIZER_SWAP", [*base, "-DRUNTIME_TU_EXTERN", rt]))
            tus.append(("its instantiation TU (PIPESWAP_INSTANTIATE_OPTIMIZER_SWAP)",
                        [*base, "-DRUNTIME_TU_INSTANTIATE", rt]))
        for name, cmd in tus:
            if args.instructions:
                t = instructions(cmd, tmp) / 1e9
            else:
                t = min(cpu_seconds(cmd) for _ in range(max(1, args.repeat)))
            rows.append((name, t))
            if not args.markdown:
                print(f"{t:6.3f} G instructions  {name}" if args.instructions else f"{t:6.2f} s  {name}", flush=True)
    if args.markdown:
        unit = "-O0 instructions (G)" if args.instructions else "-O0 CPU s"
        print(f"| translation unit | {unit} |\n|---|---:|")
        for name, t in rows:
            v = f"{t:.3f}" if args.instructions else f"{t:.2f}"
            print(f"| `{name}` | {v} |" if name.startswith("<") else f"| {name} | {v} |")


if __name__ == "__main__":
    main()
