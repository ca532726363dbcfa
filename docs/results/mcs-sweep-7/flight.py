#!/usr/bin/env python3
"""Per run, from `scripts/bench mcs-sweep --evidence`'s `*.ss.txt` (both ends' `ss -tinm` every
0.2 s), on the side that sends the data (the initiator's sockets for writes and iperf3, the
target's for reads): one line with

- retrans: segments retransmitted over the run, summed over the run's connections (the
  `retrans:a/b` total of each socket's last sample),
- in flight: the median over samples, from 3 s after the first one to the end, of the summed
  unacknowledged bytes (`unacked` x `mss`),
- unsent: the same median of the summed `notsent` bytes (data in the socket not yet sent),
- cwnd: the same median of the summed congestion windows, segments,
- limits: the last sample's rwnd-limited and sndbuf-limited seconds, summed.

Usage: flight.py RUN.ss.txt... (one line per run). Uses scripts/bench.d/mcs_ss_summary.py's
parser (run from the repository's root)."""
import os
import statistics
import sys

sys.path.insert(0, os.path.join("scripts", "bench.d"))
from mcs_ss_summary import num, parse  # noqa: E402

WARMUP = 3.0


def main():
    paths = sys.argv[1:]
    if not paths:
        sys.exit(__doc__)
    print("| run | side | conns | retrans (segments) | in flight MB | unsent MB | cwnd (segments) "
          "| rwnd-limited s | sndbuf-limited s |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for path in paths:
        side = "tgt" if "-read" in os.path.basename(path) else "ini"
        data = {k: v for k, v in parse(path).items() if k[0] == side}
        if not data:
            continue
        t0 = min(v[0][0] for v in data.values())
        # Samples are taken per side at nearly the same moment: group by rounded time.
        by_t = {}
        for v in data.values():
            for t, f in v:
                if t - t0 >= WARMUP:
                    s = by_t.setdefault(round(t, 1), [0, 0, 0])
                    s[0] += num(f.get("unacked")) * num(f.get("mss"), 1448)
                    s[1] += num(f.get("notsent"))
                    s[2] += num(f.get("cwnd"))
        rows = list(by_t.values())
        retrans = sum(num(str(v[-1][1].get("retrans", "0/0")).split("/")[-1]) for v in data.values())
        rwnd = sum(num(v[-1][1].get("rwnd_limited")) for v in data.values()) / 1e3
        sndbuf = sum(num(v[-1][1].get("sndbuf_limited")) for v in data.values()) / 1e3
        med = (lambda i: statistics.median(r[i] for r in rows)) if rows else (lambda i: 0)
        print(f"| {os.path.basename(path).removesuffix('.ss.txt')} | {side} | {len(data)} | "
              f"{retrans:.0f} | {med(0) / 1e6:.2f} | {med(1) / 1e6:.2f} | {med(2):.0f} | "
              f"{rwnd:.1f} | {sndbuf:.1f} |")


if __name__ == "__main__":
    main()
