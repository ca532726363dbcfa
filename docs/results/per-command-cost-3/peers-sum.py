#!/usr/bin/env python3
"""peers-sum.py OUT: medians (range) per binary (new/old) of peers-ab.sh's runs, per cell:
qemu-img bench against the ipsan target and tgtd, ipsan bench and iscsi-perf against the ipsan
target; the ratios the issue's goals name."""
import glob, json, os, statistics, sys
out = sys.argv[1]
runs = {}
for f in glob.glob(os.path.join(out, "*-*", "raw.jsonl")):
    side = os.path.basename(os.path.dirname(f)).split("-")[0]
    for line in open(f):
        r = json.loads(line)
        key = (side, f"{r['rw']} {r['bs']} x {r['depth']}", r["side"], r["tool"])
        runs.setdefault(key, []).append(r["mib_s"])
cells = sorted({k[1] for k in runs}, key=lambda c: (c.split()[1], c.split()[0]))
med = lambda xs: statistics.median(xs) if xs else None
def sp(xs):
    return f"{med(xs):.0f} ({min(xs):.0f}–{max(xs):.0f})" if xs else "–"
def ratio(a, b):
    return f"{med(a) / med(b):.2f}" if a and b else "–"
print("| cell | bin | qemu-img → ipsan | qemu-img → tgtd | ipsan ÷ tgtd | ipsan bench → ipsan | iscsi-perf → ipsan | bench ÷ iscsi-perf | bench → tgtd |")
print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
for c in cells:
    for side in ("new", "old"):
        q_i = runs.get((side, c, "ipsan", "qemu-img bench"), [])
        q_t = runs.get((side, c, "tgtd", "qemu-img bench"), [])
        b_i = runs.get((side, c, "ipsan", "ipsan bench"), [])
        p_i = runs.get((side, c, "ipsan", "iscsi-perf"), [])
        b_t = runs.get((side, c, "tgtd", "ipsan bench"), [])
        print(f"| {c} | {side} | {sp(q_i)} | {sp(q_t)} | {ratio(q_i, q_t)} | {sp(b_i)} | {sp(p_i)} | {ratio(b_i, p_i)} | {sp(b_t)} |")
