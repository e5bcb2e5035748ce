#!/usr/bin/env python3
"""One way to build a message in the headers: detail::message({...}) (docs/compile-times.md, "Rules").

    python3 scripts/check_messages.py [--root include/pipeswap] [--allow scripts/message_allowance.txt]

Counts, per header, the uses of std::to_string (the mark of a message built as an operator+
chain). A header may keep at most the count the allowance file gives it (the headers not yet
converted; none for any other), so the count only goes down. Prints each header over its
allowance, with its lines, and each header now under it (lower the allowance); exits 1 if any is
over. detail/message.hpp, which implements the rule, is exempt.
"""
import argparse
import pathlib
import re
import sys

USE = re.compile(r"\bstd::to_string\s*\(")
EXEMPT = {"detail/message.hpp"}


def read_allowance(path):
    allow = {}
    for line in pathlib.Path(path).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            count, name = line.split(None, 1)
            allow[name] = int(count)
    return allow


def main():
    here = pathlib.Path(__file__).resolve().parent.parent
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=here / "include" / "pipeswap")
    ap.add_argument("--allow", default=here / "scripts" / "message_allowance.txt")
    ap.add_argument("--print-counts", action="store_true", help="print the current counts as an allowance file")
    args = ap.parse_args()
    root = pathlib.Path(args.root)
    allow = read_allowance(args.allow) if not args.print_counts else {}
    over, under, total = [], [], 0
    for path in sorted(root.rglob("*")):
        if path.suffix not in (".hpp", ".cuh") or not path.is_file():
            continue
        rel = path.relative_to(root).as_posix()
        if rel in EXEMPT:
            continue
        lines = path.read_text(errors="replace").splitlines()
        hits = [(i, l.strip()) for i, l in enumerate(lines, 1) if USE.search(l)]
        n = sum(len(USE.findall(l)) for _, l in hits)
        total += n
        if args.print_counts:
            if n:
                print(f"{n} {rel}")
            continue
        if n > allow.get(rel, 0):
            over.append((rel, n, allow.get(rel, 0), hits))
        elif n < allow.get(rel, 0):
            under.append((rel, n, allow[rel]))
    if args.print_counts:
        return 0
    for rel, n, a, hits in over:
        print(f"{rel}: {n} std::to_string, {a} allowed: build the message with detail::message({{...}})")
        for i, l in hits:
            print(f"  {rel}:{i}: {l}")
    for rel, n, a in under:
        print(f"{rel}: {n} std::to_string, {a} allowed: lower its allowance in {args.allow}")
    print(f"check_messages: {total} std::to_string left in the headers; {len(over)} header(s) over their allowance")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
