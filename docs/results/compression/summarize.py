#!/usr/bin/env python3
"""Medians and ranges of raw.jsonl (run.sh): per data set, direction and compression on/off,
effective MB/s (plaintext), CPU-s/GB (bench + target, per plaintext GB) and the wire ratio
(plaintext bytes / bytes that crossed the emulated link in the data's direction)."""
import json
import statistics
import sys

rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
groups = {}
for r in rows:
    groups.setdefault((r["data"], r["rw"], r["compress"]), []).append(r)


def cell(vals, fmt):
    m = statistics.median(vals)
    return f"{fmt.format(m)} [{fmt.format(min(vals))}-{fmt.format(max(vals))}]"


print("| data | rw | compression | reps | MB/s (plaintext) | CPU-s/GB bench+target | of which target | wire ratio |")
print("|---|---|---|---:|---:|---:|---:|---:|")
for ds in ["vm", "src", "random"]:
    for rw in ["write", "read"]:
        for c in ["off", "on"]:
            g = groups.get((ds, rw, c), [])
            if not g:
                continue
            gb = [r["bytes"] / 1e9 for r in g]
            cpu = [(r["bench_cpu_s"] + r["target_cpu_s"]) / b for r, b in zip(g, gb)]
            tcpu = [r["target_cpu_s"] / b for r, b in zip(g, gb)]
            key = "wire_up_bytes" if rw == "write" else "wire_down_bytes"
            ratio = [r["bytes"] / max(1, r[key]) for r in g]
            print(f"| {ds} | {rw} | {c} | {len(g)} | {cell([r['mb_s'] for r in g], '{:.1f}')} "
                  f"| {cell(cpu, '{:.2f}')} | {cell(tcpu, '{:.2f}')} | {cell(ratio, '{:.2f}')} |")
print()
for ds in ["vm", "src", "random"]:
    for rw in ["write", "read"]:
        on = groups.get((ds, rw, "on"), [])
        off = groups.get((ds, rw, "off"), [])
        if on and off:
            sp = statistics.median(r["mb_s"] for r in on) / statistics.median(r["mb_s"] for r in off)
            print(f"- {ds} {rw}: on/off throughput {sp:.2f}x (medians)")
