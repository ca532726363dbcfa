#!/usr/bin/env python3
"""Pooled per-run rates past slow start (steady_wire_mb_s) of the 10 s parts of this directory:
per N, every iperf3 run (both directions) against every `read` run of ipsan-s20 at --depth 64,
medians, the ratio of the medians and a Mann-Whitney U test's two-sided p (normal
approximation, no ties correction): `python3 pooled.py [DIR...]` (default depth-10s
reverse-10s)."""
import json
import math
import statistics
import sys

dirs = sys.argv[1:] or ["depth-10s", "reverse-10s"]
rows = [json.loads(l) for d in dirs for l in open(f"{d}/raw.jsonl") if l.strip()]
rows = [r for r in rows if "error" not in r and r.get("steady_wire_mb_s") is not None]


def mwu(a, b):
    n1, n2 = len(a), len(b)
    u = sum((x > y) + 0.5 * (x == y) for x in a for y in b)
    mu, sd = n1 * n2 / 2, math.sqrt(n1 * n2 * (n1 + n2 + 1) / 12)
    z = (u - mu) / sd
    return u, 2 * (1 - 0.5 * (1 + math.erf(abs(z) / math.sqrt(2))))


for n in sorted({r["n"] for r in rows}):
    ip = [r["steady_wire_mb_s"] for r in rows if r["n"] == n and r["side"] in ("iperf3", "iperf3r")]
    rd = [r["steady_wire_mb_s"] for r in rows if r["n"] == n and r["side"] == "read"]
    rb = [r["steady_wire_mb_s"] for r in rows if r["n"] == n and r["side"] == "read-b"]
    mi, mr = statistics.median(ip), statistics.median(rd)
    u, p = mwu(rd, ip)
    print(f"N={n}: iperf3 (both ways) {len(ip)} runs median {mi:.2f} [{min(ip):.2f}-{max(ip):.2f}], "
          f"cv {statistics.stdev(ip) / statistics.mean(ip):.2f}; read {len(rd)} runs median {mr:.2f} "
          f"[{min(rd):.2f}-{max(rd):.2f}], cv {statistics.stdev(rd) / statistics.mean(rd):.2f}; "
          f"read / iperf3 {mr / mi:.2f}; Mann-Whitney U {u:.0f} of {len(rd) * len(ip)}, p {p:.2f}")
    if rb:
        u, p = mwu(rb, rd)
        print(f"      read-b (depth 128) {len(rb)} runs median {statistics.median(rb):.2f} "
              f"[{min(rb):.2f}-{max(rb):.2f}]; read-b / read {statistics.median(rb) / mr:.2f}, "
              f"Mann-Whitney U {u:.0f} of {len(rb) * len(rd)}, p {p:.2f}")
