#!/usr/bin/env python3
"""perside.py RAW.jsonl: per binary (A = --bin, B = --bin-b) and direction, CPU-s/GB of the
initiator (bench) and the target, user + sys from /proc, per 10^9 bytes: the median [range]
over the reps of plain, none and aes-256-gcm, and each cipher minus plain paired within a rep
(the runs of one rep ran back to back)."""
import json, sys, statistics as st
from collections import defaultdict

runs = defaultdict(dict)  # (label, rw, side) -> {(session, rep): cpu_s_per_gb}
mib = defaultdict(dict)
for line in open(sys.argv[1]):
    r = json.loads(line)
    gb = r["bytes"] / 1e9
    for side, key in (("initiator", "bench_cpu_s"), ("target", "target_cpu_s")):
        runs[(r["label"], r["rw"], side)][(r["session"], r["rep"])] = r[key] / gb
    runs[(r["label"], r["rw"], "both")][(r["session"], r["rep"])] = (r["bench_cpu_s"] + r["target_cpu_s"]) / gb
    mib[(r["label"], r["rw"])][(r["session"], r["rep"])] = r["mib_s"]


def fmt(xs):
    return f"{st.median(xs):.3f} [{min(xs):.3f}–{max(xs):.3f}]" if xs else "–"


print("| binary | direction | side | plain | none | aes-256-gcm | none − plain (paired) | aes − plain (paired) | aes − none (paired) |")
print("|---|---|---|---|---|---|---|---|---|")
for key in sorted(runs):
    label, rw, side = key
    v = runs[key]
    reps = sorted({rep for (_, rep) in v})
    col = {s: [v[(s, r)] for r in reps if (s, r) in v] for s in ("plain", "none", "aes-256-gcm")}

    def diff(a, b):
        return [v[(a, r)] - v[(b, r)] for r in reps if (a, r) in v and (b, r) in v]

    print(f"| {label} | {rw} | {side} | {fmt(col['plain'])} | {fmt(col['none'])} | {fmt(col['aes-256-gcm'])} | "
          f"{fmt(diff('none', 'plain'))} | {fmt(diff('aes-256-gcm', 'plain'))} | {fmt(diff('aes-256-gcm', 'none'))} |")
print()
print("| binary | direction | plain MiB/s | none MiB/s | aes-256-gcm MiB/s |")
print("|---|---|---|---|---|")
for key in sorted(mib):
    v = mib[key]
    reps = sorted({rep for (_, rep) in v})
    cols = [fmt([v[(s, r)] for r in reps if (s, r) in v]) for s in ("plain", "none", "aes-256-gcm")]
    print(f"| {key[0]} | {key[1]} | " + " | ".join(cols) + " |")
