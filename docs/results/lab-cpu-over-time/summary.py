#!/usr/bin/env python3
"""004 Fig. 9 from samples.csv (sample.py) and results.json (each run's start and wall
time): the target process's CPU each second of each run, printed per run (the samples, their
median and range over the steady seconds, 2 s after the start to 2 s before the end)."""
import csv, json, statistics, sys

d = sys.argv[1] if len(sys.argv) > 1 else "."
rows = list(csv.DictReader(open(f"{d}/samples.csv")))
recs = json.load(open(f"{d}/results.json"))
recs = [r for r in recs if r.get("status") in ("ok", "Ok")]
# Each run's target samples: those taken between its start and its end (results.json).
series = []
for rec in recs:
    p = rec["point"]
    t0 = rec["started_unix_s"]
    t1 = t0 + rec["wall_s"]
    pts = [(float(r["unix_s"]) - t0, float(r["cpu_pct"])) for r in rows
           if "target" in r["cmd"] and t0 <= float(r["unix_s"]) <= t1]
    if not pts:
        continue
    name = f"{rec['depth_used']} in flight, {p['delay_ms']:g} ms"
    series.append((name, pts, rec.get("throughput_mb_s", 0)))
for name, pts, mb in series:
    tmax = max(t for t, _ in pts)
    steady = [c for t, c in pts if 2 <= t <= tmax - 2] or [c for _, c in pts]
    print(f"{name}: {len(pts)} samples, median {statistics.median(steady):.1f} %, "
          f"range {min(steady):.1f}–{max(steady):.1f} %, {mb:.2f} MB/s")
    print("  per second: " + " ".join(f"{c:.0f}" for _, c in pts))
