#!/usr/bin/env python3
"""Medians [min-max] per configuration and direction from run.sh's raw.jsonl."""
import json, statistics, sys

rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print("| rw | connections | reps | MB/s median [min-max] | × 1 connection | CPU-s/GB bench+target | verified blocks |")
print("|---|---|---:|---:|---:|---:|---:|")
for rw in ("write", "read"):
    base = None
    for conf in ("c1", "c4-least-bytes", "c4-round-robin"):
        rs = [r for r in rows if r["rw"] == rw and r["conf"] == conf]
        if not rs:
            continue
        mb = [r["mb_s"] for r in rs]
        med = statistics.median(mb)
        if conf == "c1":
            base = med
        cpu = statistics.median(
            (r["bench_cpu_s"] + r["target_cpu_s"]) / (r["bytes"] / 1e9) for r in rs)
        ratio = f"{med / base:.2f}" if base else "-"
        print(f"| {rw} | {conf} | {len(rs)} | {med:.2f} [{min(mb):.2f}-{max(mb):.2f}] | {ratio} | {cpu:.1f} | {min(r['verified_blocks'] for r in rs)} |")
