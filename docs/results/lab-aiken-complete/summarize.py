#!/usr/bin/env python3
"""Theirs beside ours for the runs in this directory: Aiken et al. Table 1 at their delays
(aiken-table1/), 002 Fig. 9 (offered-load/), the disk-model LUN (aiken-disk/). Prints
markdown; README.md quotes it. Usage: summarize.py DIR"""
import json, statistics, sys, os

d = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))

def load(sub):
    p = os.path.join(d, sub, "results.json")
    if not os.path.exists(p):
        return []
    return [r for r in json.load(open(p)) if r["status"] == "ok"]

def med(v):
    return statistics.median(v) if v else float("nan")

def cell(rs, f):
    v = [r["throughput_mb_s"] for r in rs if f(r["point"])]
    if not v:
        return "–"
    if len(v) == 1:
        return "%.2f" % v[0]
    return "%.2f (%.2f–%.2f)" % (med(v), min(v), max(v))

# Aiken Table 1: netperf MB/s with packet corruption and drops, 100 Mbit/s.
T1 = {"Standard": [3.17, 4.38, 4.28, 4.53, 4.22, 3.89],
      "Maximum": [4.37, 4.24, 4.52, 4.12, 3.36, 3.68]}
T1_CI = {"Standard": [2.43, 0.68, 0.65, 0.67, 0.8, 1.07],
         "Maximum": [0.4, 0.61, 0.49, 0.54, 2.55, 2.85]}
blocks = [512, 1024, 2048, 4096, 8192, 16384]
rs = load("aiken-table1")
if rs:
    print("### Aiken et al. Table 1 at their delays (MB/s; all three pathologies)\n")
    print("| | " + " | ".join("%d" % b for b in blocks) + " | plain @1 (64 KiB) | plain @8 | seal @8 |")
    print("|---|" + "---|" * (len(blocks) + 3))
    for row in ("Standard", "Maximum"):
        print("| **theirs**, netperf, %s buffers (delay not stated) | " % row + " | ".join(
            "%.2f ± %.2f" % (a, b) for a, b in zip(T1[row], T1_CI[row])) + " | – | – | – |")
    for delay in sorted({r["point"]["delay_ms"] for r in rs}):
        at = [r for r in rs if r["point"]["delay_ms"] == delay]
        c = [cell(at, lambda p, b=b: p["scheme"] == "iperf3" and p["block"] == b) for b in blocks]
        c += [cell(at, lambda p: p["scheme"] == "plain" and p["depth"] == {"fixed": 1}),
              cell(at, lambda p: p["scheme"] == "plain" and p["depth"] == {"fixed": 8}),
              cell(at, lambda p: p["scheme"] == "seal")]
        print("| ours, iperf3 `-w 500000` / iSCSI, %g ms | " % delay + " | ".join(c) + " |")
    print()

rs = load("offered-load")
if rs:
    link = 12.5  # MB/s at 100 Mbit/s: theirs (1 Gbit/s, 8 MB window) x 1/10
    print("### 002 Fig. 9: throughput against offered load (MB/s; 100 Mbit/s, 800,000-byte buffers)\n")
    loads = sorted({r["point"]["load"] for r in rs})
    print("| RTT | " + " | ".join("%d %%" % round(l * 100) for l in loads) + " | their cap 8 MB ÷ RTT (÷ 10) |")
    print("|---|" + "---|" * (len(loads) + 1))
    for delay in sorted({r["point"]["delay_ms"] for r in rs}):
        rtt = 2 * delay
        at = [r for r in rs if r["point"]["delay_ms"] == delay]
        c = []
        for l in loads:
            v = [r["throughput_mb_s"] for r in at if abs(r["point"]["load"] - l) < 1e-9]
            theirs = min(l * link, 0.8 / (rtt / 1e3)) if rtt else l * link
            c.append(("%.2f" % med(v) if v else "–") + " (%.2f)" % theirs)
        cap = "%.2f (%.0f)" % (0.8 / (rtt / 1e3), 8 / (rtt / 1e3)) if rtt else "none"
        print("| %g ms | " % rtt + " | ".join(c) + " | %s |" % cap)
    print("\nEach cell: ours (theirs × 1/10: min(load × 12.5 MB/s, 0.8 MB ÷ RTT), Table 1's cap and 'throughput follows the load below 80 ms').\n")

rs = load("aiken-disk")
if rs:
    print("### The disk-model LUN beside the diskless one (MB/s, plain 64 KiB writes)\n")
    print("| one-way delay | null @1 | disk @1 | disk ÷ null @1 | null @8 | disk @8 | disk ÷ null @8 |")
    print("|---|---|---|---|---|---|---|")
    for delay in sorted({r["point"]["delay_ms"] for r in rs}):
        at = [r for r in rs if r["point"]["delay_ms"] == delay]
        row = []
        for depth in (1, 8):
            n = [r["throughput_mb_s"] for r in at if r["point"]["backend"] == "null" and r["point"]["depth"] == {"fixed": depth}]
            k = [r["throughput_mb_s"] for r in at if r["point"]["backend"] == "disk" and r["point"]["depth"] == {"fixed": depth}]
            row += [cell(at, lambda p, depth=depth: p["backend"] == "null" and p["depth"] == {"fixed": depth}),
                    cell(at, lambda p, depth=depth: p["backend"] == "disk" and p["depth"] == {"fixed": depth}),
                    "%.2f" % (med(k) / med(n)) if n and k else "–"]
        print("| %g ms | " % delay + " | ".join(row) + " |")
    print()
