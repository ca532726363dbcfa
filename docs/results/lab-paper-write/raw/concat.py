#!/usr/bin/env python3
"""concat.py OUT PLAN_NAME DESCRIPTION PART...: OUT gets every part's records in order, runs
renumbered; results.json, results.csv and plan.json (the parts' points, in order). For a plan
run in several parts (different delays), so nothing is replaced, only joined."""
import json, csv, sys, os
out, name, desc, parts = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
os.makedirs(out, exist_ok=True)
recs, rows, points, hdr = [], [], [], None
plan = None
for d in parts:
    recs += json.load(open(f"{d}/results.json"))
    with open(f"{d}/results.csv") as f:
        rd = csv.DictReader(f)
        if hdr is None:
            hdr = rd.fieldnames
        assert rd.fieldnames == hdr, f"{d}: different CSV columns"
        rows += list(rd)
    p = json.load(open(f"{d}/plan.json"))
    if plan is None:
        plan = p
    points += p["points"]
for i, r in enumerate(recs):
    r["run"] = i
for i, r in enumerate(rows):
    r["run"] = str(i)
plan["name"], plan["description"], plan["points"] = name, desc, points
json.dump(recs, open(f"{out}/results.json", "w"), indent=1)
json.dump(plan, open(f"{out}/plan.json", "w"), indent=1)
with open(f"{out}/results.csv", "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=hdr)
    w.writeheader()
    w.writerows(rows)
print(len(recs), "records,", len(rows), "rows,", len(points), "points from", parts)
