#!/usr/bin/env python3
"""The numbers in README.md, from raw/: per-run spread of IPsec OP-8 at 2 ms by run length,
and how often two medians of k repetitions (resampled from the 2 s runs) agree within 15 %."""
import csv, os, random, statistics as st

HERE = os.path.dirname(os.path.abspath(__file__))

def vals(dirs):
    out = []
    for d in dirs:
        with open(os.path.join(HERE, "raw", d, "results.csv")) as f:
            out += [float(r["throughput_mb_s"]) for r in csv.DictReader(f) if r["status"] == "ok"]
    return out

# g is left out: gdb stopped the lab process (and its WAN emulator threads) during it.
groups = {
    "2 s, free (a-f, h, t2r3-*, nopin-*)": vals(["a", "b", "c", "d", "e", "f", "h", "t2r3-1", "t2r3-2",
                                              "t2r3-3", "nopin-1", "nopin-2", "nopin-3"]),
    "4 s, free (t4-*)": vals(["t4-1", "t4-2", "t4-3"]),
    "6 s, free (six-*)": vals(["six-1", "six-2", "six-3"]),
    "2 s, each charon pinned to one CPU (pin01-*)": vals(["pin01-1", "pin01-2", "pin01-3"]),
}
print("| runs | n | median MB/s | min–max | CV |")
print("|---|---|---|---|---|")
for name, v in groups.items():
    cv = 100 * st.pstdev(v) / st.mean(v)
    print(f"| {name} | {len(v)} | {st.median(v):.1f} | {min(v):.1f}–{max(v):.1f} | {cv:.1f} % |")
two = groups["2 s, free (a-f, h, t2r3-*, nopin-*)"]
rng = random.Random(1)
print()
print("| repetitions | two medians within ±15 % |")
print("|---|---|")
for k in (3, 5, 7):
    n = 100_000
    ok = sum(
        0.85 <= st.median(rng.choices(two, k=k)) / st.median(rng.choices(two, k=k)) <= 1.15
        for _ in range(n)
    )
    print(f"| {k} | {100 * ok / n:.1f} % |")
