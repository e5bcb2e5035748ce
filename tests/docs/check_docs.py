#!/usr/bin/env python3
"""Compile every C++ code block of the docs.

    check_docs.py [--expect-fail FILE:LINE ...] --include DIR [--cuda-include DIR] [--work DIR]
                  MARKDOWN_OR_DIR... -- CXX [ARGS...]

A block opened with ```cpp (or ```c++) must be a whole translation unit: it is written to a file and
compiled with `CXX -std=c++20 -fsyntax-only -I DIR`; a block that defines `int main(` is built into
a program and run, and must exit with 0. Blocks opened with ```cpp fragment are excerpts
and are skipped, as are blocks that include a kernel header (*.cuh, needs nvcc) and, without
--cuda-include, blocks that include the CUDA backend. A directory argument stands for every *.md in
it, so new documents are checked without touching the build. Exits 1 if a block fails (or if an
--expect-fail block compiles), 77 if nothing was compiled.
"""
import argparse
import concurrent.futures
import os
import pathlib
import re
import subprocess
import sys

FENCE = re.compile(r"^(\s*)```+\s*(\S*)\s*(.*)$")


def blocks(path):
    """(line of the opening fence, info words, code) of every fenced block."""
    lines = path.read_text(encoding="utf-8").split("\n")
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        start, lang, rest = i + 1, m.group(2).lower(), m.group(3).split()
        body = []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith("```"):
            body.append(lines[i])
            i += 1
        i += 1
        yield start, lang, rest, "\n".join(body) + "\n"


def main():
    argv = sys.argv[1:]
    if "--" not in argv:
        sys.exit("usage: check_docs.py ... -- CXX [ARGS...]")
    cut = argv.index("--")
    ap = argparse.ArgumentParser()
    ap.add_argument("--include", required=True)
    ap.add_argument("--cuda-include", default="")
    ap.add_argument("--work", default="docs-check")
    ap.add_argument("--expect-fail", action="append", default=[])
    ap.add_argument("docs", nargs="+")
    args = ap.parse_args(argv[:cut])
    cxx = argv[cut + 1:]

    files = []
    for d in args.docs:
        p = pathlib.Path(d)
        files += sorted(p.glob("*.md")) if p.is_dir() else [p]
    work = pathlib.Path(args.work)
    work.mkdir(parents=True, exist_ok=True)

    jobs, skipped = [], []
    for f in files:
        for line, lang, rest, code in blocks(f):
            if lang not in ("cpp", "c++"):
                continue
            where = f"{f.name}:{line}"
            if "fragment" in rest:
                skipped.append(f"{where} (fragment)")
                continue
            if re.search(r"#include\s*<[^>]*\.cuh>", code):
                skipped.append(f"{where} (includes a kernel header: nvcc only)")
                continue
            extra = []
            if re.search(r"#include\s*<pipeswap/(backend|optim)/cuda", code):
                if not args.cuda_include:
                    skipped.append(f"{where} (needs the CUDA Toolkit)")
                    continue
                extra = ["-I", args.cuda_include]
            tu = work / (f.stem + f"_{line}.cpp")
            tu.write_text(f"#line {line + 1} \"{f.name}\"\n" + code, encoding="utf-8")
            base = [*cxx, "-std=c++20", "-I", args.include, *extra, str(tu)]
            if re.search(r"\bint\s+main\s*\(", code):
                exe = tu.with_suffix("")
                jobs.append((where, [*base, "-pthread", "-o", str(exe)], [str(exe)]))
            else:
                jobs.append((where, [*base, "-fsyntax-only"], None))

    def run(job):
        where, cmd, program = job
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if r.returncode != 0 or program is None:
            return where, r.returncode, r.stdout
        p = subprocess.run(program, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
        return where, p.returncode, f"the program exited with {p.returncode}\n" + p.stdout

    failed = 0
    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        for where, rc, out in pool.map(run, jobs):
            expected_fail = any(where.endswith(e) or e == where for e in args.expect_fail)
            if (rc != 0) != expected_fail:
                failed += 1
                print(f"FAIL {where}" + (" (expected to fail, compiled)" if expected_fail else ""))
                print(out[-6000:])
            else:
                print(f"ok   {where}" + (" (fails as expected)" if expected_fail else ""))
    for s in skipped:
        print(f"skip {s}")
    print(f"{len(jobs) - failed} ok, {failed} failed, {len(skipped)} skipped")
    if failed:
        return 1
    return 0 if jobs else 77


if __name__ == "__main__":
    sys.exit(main())
