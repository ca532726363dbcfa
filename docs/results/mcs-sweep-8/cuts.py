#!/usr/bin/env python3
"""Per run, from probe.py's `RUN.probe.csv.gz` (a lossy link): from 3 s after the first ACK
to 1 s before the last, how often the congestion window was cut (ssthresh changed), its
time-weighted mean, how fast it grew between cuts (segments per second, from 0.2 s after a
cut to the next, over stretches of at least 0.3 s), and the share of millisecond rows with
at least 95 % of the window in flight (window-limited, not the application).

Usage: cuts.py RUN.probe.csv.gz..."""
import csv
import gzip
import os
import statistics
import sys


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    print("| run | s | cuts | cuts/s | mean cwnd | growth between cuts, segments/s (median, n) "
          "| rows window-limited |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for path in sys.argv[1:]:
        with gzip.open(path, "rt") as f:
            r = [{k: float(v) for k, v in x.items()} for x in csv.DictReader(f)]
        a, b = r[0]["t"] + 3, r[-1]["t"] - 1
        r = [x for x in r if a <= x["t"] <= b]
        T = r[-1]["t"] - r[0]["t"]
        cuts = [i for i in range(1, len(r)) if r[i]["ssthresh"] != r[i - 1]["ssthresh"]]
        slopes = []
        for s, e in zip([0] + cuts, cuts + [len(r) - 1]):
            seg = [x for x in r[s:e] if x["t"] - r[s]["t"] > 0.2]
            if len(seg) >= 10 and seg[-1]["t"] - seg[0]["t"] >= 0.3:
                slopes.append((seg[-1]["cwnd"] - seg[0]["cwnd"]) / (seg[-1]["t"] - seg[0]["t"]))
        mean = sum((y["t"] - x["t"]) * x["cwnd"] for x, y in zip(r, r[1:])) / T
        lim = sum(1 for x in r if x["nxt"] - x["una"] >= 0.95 * x["cwnd"] * 1448) / len(r)
        name = os.path.basename(path).removesuffix(".probe.csv.gz")
        med = f"{statistics.median(slopes):.1f}" if slopes else "–"
        print(f"| {name} | {T:.1f} | {len(cuts)} | {len(cuts) / T:.2f} | {mean:.0f} | "
              f"{med} ({len(slopes)}) | {lim * 100:.0f} % |")


if __name__ == "__main__":
    main()
