#!/usr/bin/env python3
"""Summarizes run.sh's directory: summarize.py OUT > OUT/summary.md.

Per cell of `scripts/bench nvme` and per build: CPU-s/GB per side (client / target) for plain
NVMe/TCP and over TLS, medians (min-max) over the reps, and TLS's extra over plain (the
difference of the medians) against the cipher's own cost per side: one side seals, the other
opens, each 1e9 / (openssl speed's bytes/s) CPU-s per GB. And the example's rows the same way.
"""
import glob
import json
import os
import re
import statistics
import sys

out = sys.argv[1]


def spread(xs):
    return f"{statistics.median(xs):.2f} ({min(xs):.2f}–{max(xs):.2f})"


def speed(name):
    text = open(os.path.join(out, name)).read()
    k = float(re.search(r"AES-128-GCM\s+([\d.]+)k", text).group(1))
    return k * 1000


bps = [speed("openssl-speed-start.txt"), speed("openssl-speed-end.txt")]
cipher = 1e9 / statistics.median(bps)
print("# nvme-tls: old build against new, alternated\n")
print(f"AES-128-GCM (openssl speed, 16 KiB): {bps[0] / 1e9:.2f} GB/s at the start, "
      f"{bps[1] / 1e9:.2f} at the end: the cipher's own cost {cipher:.2f} CPU-s/GB per side "
      f"(seal on one, open on the other); goal: TLS's extra ≤ 1.5 × {cipher:.2f} = "
      f"{1.5 * cipher:.2f} per side.\n")
print("Load averages: see loadavg.txt.\n")

rows = {}
for build in ("old", "new"):
    for d in sorted(glob.glob(os.path.join(out, f"bench-{build}-*"))):
        for line in open(os.path.join(d, "raw.jsonl")):
            r = json.loads(line)
            key = (r["rw"], r["bs"], r["depth"])
            rows.setdefault(key, {}).setdefault((build, r["side"]), []).append(r)

print("## scripts/bench nvme (--reps 1 per build and rep, 3 s per run, 256 MiB RAM LUN)\n")
print("| cell | build | nvme MiB/s | nvme-tls MiB/s | nvme CPU-s/GB client / target | "
      "nvme-tls CPU-s/GB client / target | TLS extra client / target | extra ÷ cipher |")
print("|---|---|---:|---:|---|---|---|---|")
for key, by in rows.items():
    for build in ("old", "new"):
        p, t = by.get((build, "nvme"), []), by.get((build, "nvme-tls"), [])
        if not p or not t:
            continue
        med = lambda rs, f: statistics.median(r[f] for r in rs)
        ex_c = med(t, "client_cpu_per_gb") - med(p, "client_cpu_per_gb")
        ex_t = med(t, "target_cpu_per_gb") - med(p, "target_cpu_per_gb")
        print(f"| {key[0]} {key[1]} × {key[2]} | {build} "
              f"| {spread([r['mib_s'] for r in p])} | {spread([r['mib_s'] for r in t])} "
              f"| {spread([r['client_cpu_per_gb'] for r in p])} / {spread([r['target_cpu_per_gb'] for r in p])} "
              f"| {spread([r['client_cpu_per_gb'] for r in t])} / {spread([r['target_cpu_per_gb'] for r in t])} "
              f"| {ex_c:.2f} / {ex_t:.2f} | {ex_c / cipher:.1f}× / {ex_t / cipher:.1f}× |")

print("\n## The example (1 GiB one way, both ends in one process: CPU-s/GB of both ends)\n")
print("| row | old CPU-s/GB | new CPU-s/GB | old MB/s | new MB/s |")
print("|---|---|---|---|---|")
ex = {}
for build in ("old", "new"):
    for f in sorted(glob.glob(os.path.join(out, f"example-{build}-*.txt"))):
        for line in open(f):
            m = re.match(r"(.+?)\s+(\d+) MB/s\s+([\d.]+) CPU-s/GB", line)
            if m:
                ex.setdefault(m.group(1).strip(), {}).setdefault(build, []).append(
                    (float(m.group(2)), float(m.group(3))))
for row, by in ex.items():
    o, n = by.get("old", []), by.get("new", [])
    cell = lambda xs, i: spread([x[i] for x in xs]) if xs else "-"
    print(f"| {row} | {cell(o, 1)} | {cell(n, 1)} | {cell(o, 0)} | {cell(n, 0)} |")
plain = {b: statistics.median(x[1] for x in ex["plain TCP"][b]) for b in ("old", "new")}
for row in ex:
    if "128" in row:
        for b in ("old", "new"):
            e = statistics.median(x[1] for x in ex[row][b]) - plain[b]
            print(f"\n{row}, {b}: extra over plain TCP {e:.2f} CPU-s/GB for both ends = "
                  f"{e / (2 * cipher):.1f}× the cipher's {2 * cipher:.2f}", end="")
print()
