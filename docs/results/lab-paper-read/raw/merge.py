#!/usr/bin/env python3
"""merge.py OUT BASE KEEP_SCHEMES OTHER: OUT gets BASE's records whose scheme is not in the
other run, then OTHER's; runs renumbered in that order. results.json and results.csv."""
import json, csv, sys, os
out, base, other = sys.argv[1], sys.argv[2], sys.argv[3]
os.makedirs(out, exist_ok=True)
B = json.load(open(f"{base}/results.json")); O = json.load(open(f"{other}/results.json"))
schemes = {r['point']['scheme'] for r in O}
recs = [r for r in B if r['point']['scheme'] not in schemes] + O
for i, r in enumerate(recs): r['run'] = i
json.dump(recs, open(f"{out}/results.json", "w"), indent=1)
rows = []
for d in (base, other):
    with open(f"{d}/results.csv") as f:
        rd = csv.DictReader(f); hdr = rd.fieldnames
        rows += [(d, r) for r in rd]
rows = [r for d, r in rows if (d == other) or (r['scheme'] not in schemes)]
with open(f"{out}/results.csv", "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=hdr); w.writeheader()
    for i, r in enumerate(rows): r['run'] = str(i); w.writerow(r)
print(len(recs), len(rows), "records; replaced schemes:", schemes)
