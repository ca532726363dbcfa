#!/usr/bin/env python3
"""Median and p10-p90 of each raw RTT file (one probe per line, µs) under the given run dirs,
as the Markdown rows of README.md: python3 summarize.py before-1 after-1 ..."""
import pathlib
import sys

def q(v, p):
    return v[round((len(v) - 1) * p)]

print("| run | method | one-way delay | set RTT | n | median | error | p10 | p90 |")
print("|---|---|---|---|---|---|---|---|---|")
for run in sys.argv[1:]:
    for method in ("ping", "tcp"):
        for d in (1, 8, 32, 64):
            f = pathlib.Path(run) / f"{method}-{d}ms.txt"
            if not f.exists():
                continue
            v = sorted(int(x) for x in f.read_text().split())
            want = 2 * d * 1000
            med = q(v, 0.5)
            print(f"| {run} | {method} | {d} ms | {2 * d} ms | {len(v)} | {med / 1000:.3f} ms "
                  f"| {100 * (med / want - 1):+.2f} % | {q(v, 0.1) / 1000:.3f} ms | {q(v, 0.9) / 1000:.3f} ms |")
