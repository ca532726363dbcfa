#!/usr/bin/env python3
"""Per run, from probe.py's `RUN.probe.csv.gz`: the data sender's rate (bytes acknowledged
per second), and time-weighted means of the data queued in its socket (written - snd_una),
in flight (snd_nxt - snd_una) and unsent (the difference), from 3 s after the first ACK to
1.5 s before the last; the median cwnd and the pacing rate the kernel derives from it after
slow start (1.2 x cwnd x 1448 B / srtt, net.ipv4.tcp_pacing_ca_ratio 120); and the share of
that time with less than 2 MB in flight.

Usage: pacing.py RUN.probe.csv.gz... (one table row per run)."""
import csv
import gzip
import os
import statistics
import sys


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    print("| run | MB/s acked | queued MB | in flight MB | unsent MB | cwnd (median) "
          "| pacing MB/s at it | time < 2 MB in flight |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for path in sys.argv[1:]:
        with gzip.open(path, "rt") as f:
            rows = [{k: float(v) for k, v in r.items()} for r in csv.DictReader(f)]
        a, b = rows[0]["t"] + 3, rows[-1]["t"] - 1.5
        win = [r for r in rows if a <= r["t"] <= b]
        T = win[-1]["t"] - win[0]["t"]
        q = i = low = 0.0
        for x, y in zip(win, win[1:]):
            dt = y["t"] - x["t"]
            infl = x["nxt"] - x["una"]
            q += (x["written"] - x["una"]) * dt
            i += infl * dt
            low += dt if infl < 2e6 else 0
        rate = (win[-1]["una"] - win[0]["una"]) / T
        cwnd = statistics.median(r["cwnd"] for r in win)
        srtt = statistics.median(r["srtt_us"] for r in win) / 1e6
        name = os.path.basename(path).removesuffix(".probe.csv.gz")
        print(f"| {name} | {rate / 1e6:.1f} | {q / T / 1e6:.2f} | {i / T / 1e6:.2f} | "
              f"{(q - i) / T / 1e6:.2f} | {cwnd:.0f} | {1.2 * cwnd * 1448 / srtt / 1e6:.0f} | "
              f"{low / T * 100:.0f} % |")


if __name__ == "__main__":
    main()
