"""Per-rep A ÷ B ratios of `scripts/bench seal --bin-b` runs, with 95 % bootstrap intervals of
their median (4,000 resamples): python3 boot.py RAW [RAW ...] (the reps of several runs pooled;
each run's reps paired A with B as they ran, back to back)."""
import json
import random
import statistics as st
import sys

rs = []
for i, p in enumerate(sys.argv[1:]):
    for line in open(p):
        r = json.loads(line)
        r["file"] = i
        rs.append(r)
random.seed(1)


def ci(x):
    bs = sorted(st.median(random.choices(x, k=len(x))) for _ in range(4000))
    return st.median(x), bs[100], bs[3900]


for s in sorted({r["session"] for r in rs}):
    for rw in ["write", "read"]:
        a, b = {}, {}
        for r in rs:
            if r["session"] == s and r["rw"] == rw:
                (a if r["label"] == "A" else b)[(r["file"], r["rep"])] = r
        keys = sorted(set(a) & set(b))
        if not keys:
            continue
        rat = [a[k]["mib_s"] / b[k]["mib_s"] for k in keys]
        cpu = [(a[k]["bench_cpu_s"] + a[k]["target_cpu_s"]) / (b[k]["bench_cpu_s"] + b[k]["target_cpu_s"]) for k in keys]
        m, lo, hi = ci(rat)
        cm, clo, chi = ci(cpu)
        print(f"{s} {rw}: n={len(rat)} MiB/s A ÷ B median {m:.3f} [95 % CI {lo:.3f}–{hi:.3f}]; "
              f"CPU-s/GB A ÷ B {cm:.3f} [{clo:.3f}–{chi:.3f}]")
