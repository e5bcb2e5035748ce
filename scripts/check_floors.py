#!/usr/bin/env python3
"""Checks that every include between pipeswap's headers points down (docs/floors.md).

    python3 scripts/check_floors.py [--floors docs/floors.md] [--root include/pipeswap]

Reads the numbered floor list of docs/floors.md, maps every header under the root to its floor (its
first folder, or its own name for a top-level header), and prints one line per include of a higher
floor and per loop of includes between files. Exits 1 if it printed any, 0 otherwise.
"""
import argparse
import pathlib
import re
import sys

INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*[<"]pipeswap/([^>"]+)[>"]', re.M)
FLOOR_LINE = re.compile(r"^\s*(\d+)\.\s+(.*)$")
NAME = re.compile(r"`([^`]+)`")


def read_floors(path):
    """{'backend': 4, 'error.hpp': 3, ...} from the numbered list: folders end with '/'."""
    floors = {}
    for line in pathlib.Path(path).read_text().splitlines():
        m = FLOOR_LINE.match(line)
        if not m:
            continue
        names = NAME.findall(m.group(2).split(" — ")[0])
        for n in names:
            floors[n.rstrip("/")] = int(m.group(1))
    if not floors:
        sys.exit(f"check_floors: {path} has no numbered floor list")
    return floors


def floor_key(rel):
    parts = rel.split("/")
    return parts[0]


def check(root, floors):
    root = pathlib.Path(root)
    problems = []
    graph = {}
    for path in sorted(root.rglob("*")):
        if path.suffix not in (".hpp", ".cuh", ".h") or not path.is_file():
            continue
        rel = path.relative_to(root).as_posix()
        key = floor_key(rel)
        if key not in floors:
            problems.append(f"{rel}: on no floor ('{key}' is not in the floor list)")
            continue
        graph[rel] = []
        text = path.read_text(errors="replace")
        for m in INCLUDE.finditer(text):
            target = m.group(1)
            line = text.count("\n", 0, m.start()) + 1
            graph[rel].append(target)
            tkey = floor_key(target)
            if tkey not in floors:
                problems.append(f"{rel}:{line}: includes <pipeswap/{target}>, on no floor ('{tkey}')")
            elif floors[tkey] > floors[key]:
                problems.append(
                    f"{rel}:{line}: includes <pipeswap/{target}>, floor {floors[tkey]} ({tkey}), "
                    f"above its own floor {floors[key]} ({key})")
    # Loops between files (of one floor: the check above already refuses every other).
    state = {}

    def visit(node, stack):
        state[node] = 1
        stack.append(node)
        for nxt in graph.get(node, []):
            if nxt not in graph:
                continue
            if state.get(nxt) == 1:
                loop = stack[stack.index(nxt):] + [nxt]
                problems.append("include loop: " + " -> ".join(loop))
            elif nxt not in state:
                visit(nxt, stack)
        stack.pop()
        state[node] = 2

    for node in graph:
        if node not in state:
            visit(node, [])
    return problems, len(graph)


def main():
    here = pathlib.Path(__file__).resolve().parent.parent
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--floors", default=here / "docs" / "floors.md")
    ap.add_argument("--root", default=here / "include" / "pipeswap")
    args = ap.parse_args()
    problems, n = check(args.root, read_floors(args.floors))
    for p in problems:
        print(p)
    if problems:
        print(f"check_floors: {len(problems)} problem(s) in {n} headers (the floors: {args.floors})")
        return 1
    print(f"check_floors: {n} headers, every include points down")
    return 0


if __name__ == "__main__":
    sys.exit(main())
