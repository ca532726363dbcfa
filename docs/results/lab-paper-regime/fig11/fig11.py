#!/usr/bin/env python3
"""Fig. 11's metric from prediction.csv: OP-n / IPsec @1 per block (medians over the
repetitions), averaged over the blocks, measured and as ipsan's model predicted it from the
calibration alone (out of sample), per delay; and the error of the predicted mean ratio."""
import csv
import sys
from collections import defaultdict

path = sys.argv[1] if len(sys.argv) > 1 else "prediction.csv"
rows = list(csv.DictReader(open(path)))
# (delay, scheme, depth, block) -> (measured, predicted)
pt = {}
for r in rows:
    k = (float(r["delay_ms"]), r["scheme"], int(r["depth"]), int(r["block"]))
    pred = float(r["ipsan_mb_s"]) if r["ipsan_mb_s"] else float("nan")
    pt[k] = (float(r["measured_mb_s"]), pred)
print("delay_ms,op,blocks,measured_mean_ratio,predicted_mean_ratio,error_pct,per_block_measured")
for d in sorted({k[0] for k in pt}):
    blocks = sorted(k[3] for k in pt if k[0] == d and k[1] == "ipsec")
    for n in sorted({k[2] for k in pt if k[0] == d and k[1] == "seal"}):
        m, p, per = [], [], []
        for b in blocks:
            s, i = pt.get((d, "seal", n, b)), pt.get((d, "ipsec", 1, b))
            if s is None or i is None:
                continue
            m.append(s[0] / i[0])
            p.append(s[1] / i[1])
            per.append(f"{b // 1024}K:{s[0] / i[0]:.2f}")
        if not m:
            continue
        mm, pm = sum(m) / len(m), sum(p) / len(p)
        print(f"{d:g},{n},{len(m)},{mm:.2f},{pm:.2f},{(mm / pm - 1) * 100:+.1f},{' '.join(per)}")
