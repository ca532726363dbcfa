#!/usr/bin/env python3
"""abtable.py RAW.jsonl [RAW2.jsonl ...]: A/B table of `scripts/bench seal --bin-b` runs.
Per (bs, depth, session, rw): medians of MiB/s and CPU s/GB (bench + target) per binary, the
ratio of medians, and the median and range of the per-rep ratios (each rep's A and B ran back
to back)."""
import json, sys, statistics as st
from collections import defaultdict
rows = defaultdict(lambda: {"A": {}, "B": {}})
for i, path in enumerate(sys.argv[1:]):
    for line in open(path):
        r = json.loads(line)
        key = (r["bs"], r["depth"], r["session"], r["rw"])
        gb = r["bytes"] / 1e9
        rows[key][r["label"]][(i, r["rep"])] = (r["mib_s"], (r["bench_cpu_s"] + r["target_cpu_s"]) / gb)
print("| cell | session, direction | reps | A MiB/s | B MiB/s | A ÷ B | per-rep A ÷ B median [range] | A CPU s/GB | B CPU s/GB | CPU A ÷ B | per-rep CPU A ÷ B median [range] |")
print("|---|---|---:|---:|---:|---:|---|---:|---:|---:|---|")
for key in sorted(rows, key=lambda k: (k[0], k[2], k[3])):
    a, b = rows[key]["A"], rows[key]["B"]
    reps = sorted(set(a) & set(b))
    am = st.median(a[k][0] for k in reps); bm = st.median(b[k][0] for k in reps)
    ac = st.median(a[k][1] for k in reps); bc = st.median(b[k][1] for k in reps)
    rr = [a[k][0] / b[k][0] for k in reps]; cr = [a[k][1] / b[k][1] for k in reps]
    print(f"| {key[0]} × {key[1]} | {key[2]} {key[3]} | {len(reps)} | {am:.0f} | {bm:.0f} | {am/bm:.2f} | "
          f"{st.median(rr):.2f} [{min(rr):.2f}–{max(rr):.2f}] | {ac:.2f} | {bc:.2f} | {ac/bc:.2f} | "
          f"{st.median(cr):.2f} [{min(cr):.2f}–{max(cr):.2f}] |")
