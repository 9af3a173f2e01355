#!/usr/bin/env python3
"""Where a running process's resident memory is: /proc/PID/smaps grouped by kind.

    scripts/footprint.py PID [--json]

Kinds (from the mappings alone, no help from the process):
  file:<name>     file-backed mappings (the model's weights when mapped, the binary, libraries)
  main heap       [heap]: glibc's main arena (brk)
  malloc arenas   the other glibc arenas: anonymous heaps inside 64 MiB-aligned reservations
                  (each thread that allocates may get one; up to 8 per core)
  thread stacks   anonymous mappings right above a 4 KiB guard page (pthread stacks)
  [stack]         the main thread's stack
  other anon      everything else anonymous: large malloc blocks (>= the mmap threshold)
                  and the buffers mapped directly (the KV pool, the DRAM tier, ...), listed
                  one by one when over 1 MiB resident
For each: mappings, Size (reserved), Rss, and AnonHugePages (resident in 2 MiB pages).
"""
import json
import sys

ARENA = 64 << 20  # glibc's HEAP_MAX_SIZE on 64-bit


def parse(pid):
    maps = []
    cur = None
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            parts = line.split()
            if "-" in parts[0] and len(parts) >= 5 and ":" not in parts[0]:
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
                cur = {"lo": lo, "hi": hi, "perms": parts[1], "path": " ".join(parts[5:]) if len(parts) > 5 else "",
                       "Size": 0, "Rss": 0, "AnonHugePages": 0}
                maps.append(cur)
            elif parts[0].rstrip(":") in ("Size", "Rss", "AnonHugePages") and cur is not None:
                cur[parts[0].rstrip(":")] = int(parts[1]) * 1024
    return maps


def classify(maps):
    kinds = {}
    big_other = []
    for i, m in enumerate(maps):
        path = m["path"]
        prev = maps[i - 1] if i > 0 else None
        if path == "[heap]":
            k = "main heap"
        elif path == "[stack]":
            k = "[stack]"
        elif path.startswith("["):
            k = path
        elif path:
            k = "file:" + path.rsplit("/", 1)[-1]
        elif m["perms"].startswith("---"):
            k = "reserved (no access)"
        elif m["lo"] % ARENA == 0 and m["hi"] - m["lo"] <= ARENA:
            k = "malloc arenas"
        elif prev is not None and prev["hi"] == m["lo"] and prev["perms"].startswith("---") and \
                prev["hi"] - prev["lo"] == 4096:
            k = "thread stacks"
        else:
            k = "other anon"
            if m["Rss"] > (1 << 20):
                big_other.append(m)
        d = kinds.setdefault(k, {"mappings": 0, "size": 0, "rss": 0, "anon_huge": 0})
        d["mappings"] += 1
        d["size"] += m["Size"]
        d["rss"] += m["Rss"]
        d["anon_huge"] += m["AnonHugePages"]
    return kinds, big_other


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        sys.exit(2)
    pid = sys.argv[1]
    maps = parse(pid)
    kinds, big = classify(maps)
    total = sum(d["rss"] for d in kinds.values())
    if "--json" in sys.argv:
        print(json.dumps({"pid": int(pid), "rss": total, "kinds": kinds,
                          "other_anon_over_1m": [{"size": m["Size"], "rss": m["Rss"]} for m in big]}))
        return
    mib = lambda b: b / (1 << 20)
    print(f"| kind | mappings | reserved MiB | RSS MiB | in huge pages MiB |")
    print(f"|---|---|---|---|---|")
    for k, d in sorted(kinds.items(), key=lambda kv: -kv[1]["rss"]):
        if d["rss"] == 0 and not k.startswith("malloc"):
            continue
        if k.startswith("file:") and d["rss"] < (1 << 20):
            continue
        print(f"| {k} | {d['mappings']} | {mib(d['size']):.1f} | {mib(d['rss']):.1f} | {mib(d['anon_huge']):.1f} |")
    small_files = sum(d["rss"] for k, d in kinds.items() if k.startswith("file:") and d["rss"] < (1 << 20))
    print(f"| files under 1 MiB each | | | {mib(small_files):.1f} | |")
    print(f"| **total** | {len(maps)} | | **{mib(total):.1f}** | {mib(sum(d['anon_huge'] for d in kinds.values())):.1f} |")
    if big:
        print("\nother anon mappings over 1 MiB resident (MiB reserved / resident):",
              ", ".join(f"{mib(m['Size']):.1f}/{mib(m['Rss']):.1f}" for m in sorted(big, key=lambda m: -m["Rss"])))


if __name__ == "__main__":
    main()
