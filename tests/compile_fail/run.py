#!/usr/bin/env python3
"""Compile-fail test driver.

usage: run.py --include DIR FILE -- COMPILER [ARGS...]

FILE must fail to compile, and the compiler's diagnostics must contain every text given on a line
`// expect: TEXT` in FILE. The same file compiled with -DPIPESWAP_COMPILING_TWIN must succeed, which
shows that the failure comes from the line under test and not from a typo elsewhere.
"""
import subprocess
import sys


def main() -> int:
    args = sys.argv[1:]
    sep = args.index("--")
    opts, compiler = args[:sep], args[sep + 1:]
    include = opts[opts.index("--include") + 1]
    source = [a for a in opts if a.endswith(".cpp")][0]
    expects = [line.split("// expect:", 1)[1].strip()
               for line in open(source, encoding="utf-8") if "// expect:" in line]
    if not expects:
        print(f"{source}: no '// expect:' line")
        return 1
    base = compiler + ["-fsyntax-only", "-I", include, source]
    bad = subprocess.run(base, capture_output=True, text=True)
    if bad.returncode == 0:
        print(f"{source}: compiled, but it must not")
        return 1
    missing = [e for e in expects if e not in bad.stderr]
    if missing:
        print(f"{source}: diagnostics lack {missing!r}\n--- diagnostics ---\n{bad.stderr[:4000]}")
        return 1
    twin = subprocess.run(base + ["-DPIPESWAP_COMPILING_TWIN"], capture_output=True, text=True)
    if twin.returncode != 0:
        print(f"{source}: the compiling twin failed\n{twin.stderr[:4000]}")
        return 1
    print(f"{source}: fails with {expects!r}; twin compiles")
    return 0


if __name__ == "__main__":
    sys.exit(main())
