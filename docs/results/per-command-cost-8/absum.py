#!/usr/bin/env python3
"""absum.py RAW.jsonl: ab.sh's runs per cell and side, median MiB/s, range, and the ratio to the
side listed first."""
import json,sys,statistics as st,collections
d=collections.defaultdict(list)
for l in open(sys.argv[1]):
    j=json.loads(l); d[(j['cell'],j['side'])].append(j['mib_s'])
cells=sorted({c for c,_ in d})
for c in cells:
    sides=[s for cc,s in d if cc==c]
    base=st.median(d[(c,sides[0])])
    for s in sides:
        v=d[(c,s)]; print(f"{c:22} {s:12} median {st.median(v):8.1f}  n={len(v)}  range {min(v):.0f}-{max(v):.0f}  ratio-to-{sides[0]} {st.median(v)/base:.3f}")
