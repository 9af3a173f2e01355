#!/usr/bin/env python3
"""Checks the module order (docs/architecture.md "Module order").

The order is written once, in docs/architecture.md (the first table under "Module order"),
bottom-up: a module uses only modules listed before it. This script fails (exit 1, one line
per problem) unless
  * the order lists every module of DESIGN.md in DESIGN.md's order (when --design is given),
    and every directory under src/ and include/attic/;
  * every CMake dependency between modules (--deps, written by CMakeLists.txt at configure
    time) points to a module listed before its own;
  * every #include in a module's sources and headers (tests excluded) names its own module
    or one listed before it, and one the module's CMake target reaches (declared);
  * every module dependency CMake declares is used by an #include (none stale);
so that DESIGN.md's order, CMake's dependencies and the includes are one graph, without
cycles.

A file's module: src/<m>/..., include/attic/<m>/... -> m; bench/... -> bench; the
`attic` executable's sources are cli. An include's module: "attic/<m>/..." -> m,
"<m>/..." (a module's private headers under src/) -> m, "bench/..." -> bench. Tests
(*_test.cc, tests/) link what they exercise and are not checked.
"""
import argparse
import os
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def doc_order(text):
    """The modules of the first table under '## Module order' (first column, `name`)."""
    m = re.search(r"^## Module order\b.*?\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    if not m:
        return None
    order, in_table = [], False
    for line in m.group(1).splitlines():
        if not line.startswith("|"):
            if in_table:
                break  # the end of the first table
            continue
        in_table = True
        cell = re.match(r"^\|\s*`?([a-z_]+)`?\s*\|", line)
        if cell and cell.group(1) not in ("module",):
            order.append(cell.group(1))
    return order


def design_order(text):
    """DESIGN.md's module table: '## Modules (bottom-up ...)'."""
    m = re.search(r"^## Modules\b.*?\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    if not m:
        return None
    return [c.group(1) for c in (re.match(r"^\|\s*([a-z_]+)\s*\|", l) for l in m.group(1).splitlines())
            if c and c.group(1) != "module"]


def target_module(target, modules):
    if target == "attic":
        return "cli"
    if target in ("attic_redis",):
        return "store"
    if target in ("attic_pic_redis",):
        return "pic"
    if target.startswith("attic_bench") or target.endswith("_bench"):
        return "bench"  # its libraries and programs
    if target.startswith("attic_") and target[len("attic_"):] in modules:
        return target[len("attic_"):]
    return None


def file_module(rel):
    parts = rel.split("/")
    if parts[0] == "src" and len(parts) > 2:
        return parts[1]
    if parts[:2] == ["include", "attic"] and len(parts) > 3:
        return parts[2]
    if parts[0] == "bench":
        return "bench"
    return None


def include_module(inc, modules):
    parts = inc.split("/")
    if parts[0] == "attic" and len(parts) > 2:
        return parts[1]
    if len(parts) > 1 and parts[0] in modules:
        return parts[0]
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--source", required=True, help="the repository root")
    ap.add_argument("--deps", required=True, help="CMake's module dependencies (target: deps...)")
    ap.add_argument("--design", help="DESIGN.md, whose module list the order must keep")
    a = ap.parse_args()
    problems = []

    order = doc_order(read(os.path.join(a.source, "docs/architecture.md")))
    if not order:
        print("docs/architecture.md: no '## Module order' table")
        return 1
    rank = {m: i for i, m in enumerate(order)}
    modules = set(order)
    if len(rank) != len(order):
        problems.append("docs/architecture.md: a module is listed twice")

    if a.design and os.path.exists(a.design):
        design = design_order(read(a.design)) or []
        missing = [m for m in design if m not in rank]
        if missing:
            problems.append(f"docs/architecture.md: DESIGN.md's modules {missing} are not in the order")
        kept = [m for m in order if m in design]
        if not missing and kept != design:
            problems.append(f"docs/architecture.md: the order {kept} differs from DESIGN.md's {design}")
    for top in ("src", "include/attic"):
        for d in sorted(os.listdir(os.path.join(a.source, top))):
            if os.path.isdir(os.path.join(a.source, top, d)) and d not in modules:
                problems.append(f"{top}/{d}: not a module of the order")

    # CMake: target -> direct dependencies (module level).
    declared = {m: set() for m in order}
    for line in read(a.deps).splitlines():
        if ":" not in line:
            continue
        target, deps = line.split(":", 1)
        src = target_module(target.strip(), modules)
        if src is None:
            continue
        for dep in deps.split():
            dst = target_module(dep, modules)
            if dst is None or dst == src:
                continue
            declared[src].add(dst)
            if rank[dst] > rank[src]:
                problems.append(f"CMake: {target.strip()} ({src}) depends on {dep} ({dst}), a module above it")

    def reach(m):
        seen, todo = set(), [m]
        while todo:
            for d in declared[todo.pop()]:
                if d not in seen:
                    seen.add(d)
                    todo.append(d)
        return seen

    # Includes of every non-test source and header.
    used = {m: set() for m in order}
    roots = ["src", "include/attic", "bench"]
    for root in roots:
        for dirpath, _, files in os.walk(os.path.join(a.source, root)):
            for name in sorted(files):
                if not name.endswith((".h", ".cc")) or name.endswith("_test.cc"):
                    continue
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, a.source)
                src = file_module(rel)
                if src is None:
                    continue
                if src not in modules:
                    continue  # reported above
                for inc in INCLUDE.findall(read(path)):
                    dst = include_module(inc, modules)
                    if dst is None or dst == src:
                        continue
                    used[src].add(dst)
                    if rank[dst] > rank[src]:
                        problems.append(f"{rel}: includes {inc} ({dst}), a module above {src}")
                    elif dst not in reach(src):
                        problems.append(f"{rel}: includes {inc} ({dst}), which {src}'s CMake target does not declare")
    for src in order:
        for dst in sorted(declared[src] - used[src]):
            problems.append(f"CMake: {src} declares {dst}, which no file of {src} includes")

    for p in problems:
        print(p)
    if problems:
        print(f"module order: {len(problems)} problem(s)")
        return 1
    print("module order: " + " < ".join(order) + " (CMake and includes agree)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
