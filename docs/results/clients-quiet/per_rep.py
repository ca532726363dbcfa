#!/usr/bin/env python3
"""per_rep.py DIR: per-rep ipsan bench ÷ iscsi-perf (commands in the same rep) from
clients-target-sum.py's summary.txt in DIR, with medians and ranges of each side."""
import statistics as st
import sys

d = sys.argv[1]
rows = {}
for line in open(f"{d}/summary.txt"):
    p = line.split()
    if len(p) > 3 and p[0] in ("t1", "t2", "perf") and p[1].isdigit():
        rows[(p[0], int(p[1]))] = (int(p[2]), float(p[5]))
reps = sorted({r for _, r in rows})
for s in ("t1", "t2", "perf"):
    c = [rows[(s, r)][0] for r in reps]
    cpu = [rows[(s, r)][1] for r in reps]
    print(f"{s:4} commands per run median {st.median(c)} [{min(c)}–{max(c)}], client CPU µs/cmd median {st.median(cpu)}")
for s in ("t1", "t2"):
    rs = [rows[(s, r)][0] / rows[("perf", r)][0] for r in reps]
    print(f"{s} ÷ perf per rep: {' '.join(f'{x:.2f}' for x in rs)}; median {st.median(rs):.3f} [{min(rs):.2f}–{max(rs):.2f}]")
