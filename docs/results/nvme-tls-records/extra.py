#!/usr/bin/env python3
"""TLS's extra CPU over plain NVMe/TCP per build, from a `scripts/bench nvme --bin-b` run:
extra.py BENCH_DIR OPENSSL_SPEED_START OPENSSL_SPEED_END > extra.md

Per cell and build (A = new, B = old): the medians over reps of CPU-s/GB per side (client /
target) for plain NVMe/TCP and NVMe/TCP + TLS, the extra (difference of the medians), and the
extra against AES-128-GCM's own cost per side as `openssl speed` measured it at the start and
the end of the run (one side seals, the other opens: 1e9 / bytes-per-second CPU-s per GB).
"""
import json
import re
import statistics
import sys

rows = [json.loads(l) for l in open(sys.argv[1] + "/raw.jsonl")]


def speed(path):
    k = float(re.findall(r"AES-128-GCM\s+([\d.]+)k", open(path).read())[-1])
    return k * 1000


bps = [speed(sys.argv[2]), speed(sys.argv[3])]
cipher = 1e9 / statistics.median(bps)
print(f"AES-128-GCM (openssl speed -evp aes-128-gcm -bytes 16384): {bps[0] / 1e9:.2f} GB/s at the "
      f"start, {bps[1] / 1e9:.2f} at the end: {cipher:.2f} CPU-s/GB per side; the goal, "
      f"extra ≤ 1.5 × that = {1.5 * cipher:.2f}.\n")
print("| cell | build | nvme CPU-s/GB client / target | nvme-tls CPU-s/GB client / target "
      "| TLS extra client / target | extra ÷ cipher | nvme-tls MiB/s |")
print("|---|---|---|---|---|---|---:|")
cells = []
for r in rows:
    c = (r["rw"], r["bs"], r["depth"])
    if c not in cells:
        cells.append(c)


def med(xs):
    return statistics.median(xs)


def rng(xs):
    return f"{med(xs):.2f} ({min(xs):.2f}–{max(xs):.2f})"


for c in cells:
    for build, name in (("A", "new"), ("B", "old")):
        sel = {s: [r for r in rows if (r["rw"], r["bs"], r["depth"]) == c and r["target"] == build
                   and r["side"] == s] for s in ("nvme", "nvme-tls")}
        if not sel["nvme"] or not sel["nvme-tls"]:
            continue
        p = {k: [r[f"{k}_cpu_per_gb"] for r in sel["nvme"]] for k in ("client", "target")}
        t = {k: [r[f"{k}_cpu_per_gb"] for r in sel["nvme-tls"]] for k in ("client", "target")}
        ex = {k: med(t[k]) - med(p[k]) for k in ("client", "target")}
        mib = [r["mib_s"] for r in sel["nvme-tls"]]
        print(f"| {c[0]} {c[1]} × {c[2]} | {name} | {rng(p['client'])} / {rng(p['target'])} "
              f"| {rng(t['client'])} / {rng(t['target'])} | {ex['client']:.2f} / {ex['target']:.2f} "
              f"| {ex['client'] / cipher:.1f}× / {ex['target'] / cipher:.1f}× | {rng(mib)} |")
