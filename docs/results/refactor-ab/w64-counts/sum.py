#!/usr/bin/env python3
"""sum.py DIR: per-command costs from counts.sh's files in DIR: (count at N2 - count at N1) /
(N2 - N1) for every perf stat event and for callgrind's instructions (Ir), per side."""
import glob
import os
import re
import sys
from collections import defaultdict

d = sys.argv[1]
SHORT = {"context-switches": "cs", "cpu-migrations": "migr", "task-clock": "task-clock(us)",
         "raw_syscalls:sys_enter": "syscalls"}


def perf(f):
    r = {}
    for line in open(f):
        m = re.match(r"\s*([\d,.]+)\s+(msec\s+)?(\S+)", line)
        if m:
            try:
                v = float(m.group(1).replace(",", ""))
            except ValueError:
                continue
            k = m.group(3)
            if k == "task-clock":
                v *= 1000.0  # msec -> us
            r[SHORT.get(k, k.replace("syscalls:sys_enter_", ""))] = v
    return r


def ir(f):
    """Callgrind's total, and the total without glibc's memmove/memcpy and memset: the one
    64 KiB copy into the RAM store counts as 65,536 instructions (rep movsb, one per byte)
    and the zeroing of reused heap pages depends on the allocator's state in that process,
    not on the command (docs: README.md here)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import cgfiles
    by_file = cgfiles.parse(f)
    total = sum(by_file.values())
    bulk = {"memmove": 0.0, "memset": 0.0}
    for k, v in by_file.items():
        for b in bulk:
            if f"{b}-vec-unaligned-erms" in k:
                bulk[b] += v
    # AWS-LC's jitter entropy source, run once per process when a sealed login first draws
    # random bytes: its loop count depends on timing (valgrind's), not on the commands.
    jitter = sum(v for k, v in by_file.items() if "jitterentropy" in k)
    r = {"Ir": total, "Ir-memmove-memset": total - bulk["memmove"] - bulk["memset"],
         "memmove": bulk["memmove"], "memset": bulk["memset"]}
    if jitter:
        r["Ir-memmove-memset-jitter"] = r["Ir-memmove-memset"] - jitter
        r["jitter"] = jitter
    return r


runs = defaultdict(dict)  # (kind, side, tag) -> {n: counts}
for f in glob.glob(os.path.join(d, "perf-*-*.txt")) + glob.glob(os.path.join(d, "cg-*-*.out")) + glob.glob(os.path.join(d, "cg-*-*.out.gz")):
    if "--perf-only" in sys.argv and f.endswith(".out"):
        continue
    b = os.path.basename(f)
    m = re.match(r"(perf|cg)-(target|bench)-(.+)-(\d+)\.(txt|out|out\.gz)$", b)
    if not m:
        continue
    kind, side, tag, n = m.group(1), m.group(2), m.group(3), int(m.group(4))
    runs[(kind, side, tag)][n] = perf(f) if kind == "perf" else ir(f)

for (kind, side, tag), by_n in sorted(runs.items(), key=lambda kv: (kv[0][2].split("-", 1)[1], kv[0][0], kv[0][1], kv[0][2])):
    ns = sorted(by_n)
    if len(ns) < 2:
        continue
    lo, hi = ns[0], ns[-1]
    dn = hi - lo
    keys = [k for k in by_n[hi] if by_n[hi][k] or by_n[lo].get(k)]
    cols = " ".join(f"{k} {(by_n[hi][k] - by_n[lo].get(k, 0)) / dn:.3f}" for k in keys)
    print(f"{tag:32} {kind:4} {side:6} per command ({lo}..{hi}): {cols}")
