#!/usr/bin/env python3
"""What bound each run's data sender (README.md "Where the reads are"): from a run's `--evidence`
`ss` samples (`<run>.ss.txt`), over the sockets that sent data (the target's for reads and
iperf3 -R, the initiator namespace's for iperf3), from 3 s after the first 256 KiB were
acknowledged to 0.5 s before the run's end (the summary's window, approximately; the samples
are 0.2-0.4 s apart):
- sum cwnd: the sum of the sockets' congestion windows (segments), averaged over the samples;
- MB/s: bytes acknowledged over the window (all sockets);
- MB/s per cwnd: the two divided (≈ 1448 B / RTT if the windows bind: 0.022 at 64 ms);
- not backlogged: socket-samples whose unsent bytes (`notsent`) were under one window, of all;
- retransmitted segments by 1, 2 and 3 s after the start and at the end, and the largest sum of
  windows in the first 3 s (slow start's overshoot).
`python3 ss_cwnd.py FILE.ss.txt...`"""
import collections
import re
import sys


def parse(fn):
    socks = collections.defaultdict(list)
    t = ns = hdr = None
    for line in open(fn):
        if line.startswith("t="):
            p = line.split()
            t, ns = float(p[0][2:]), p[1][3:]
        elif line.startswith("\t") and hdr:
            d = {m.group(1): float(m.group(2)) for m in re.finditer(r"(\w+):([\d.]+)", line)}
            socks[ns, hdr[2], hdr[3]].append((t, d))
        elif line.strip():
            hdr = line.split()
    return socks


def main():
    for fn in sys.argv[1:]:
        by = collections.defaultdict(dict)
        socks = parse(fn)
        # The data's sender is the namespace whose sockets had the most acknowledged (a read's
        # initiator sends commands too: thousands of small segments in a 30 s run).
        sent = collections.Counter()
        for k, v in socks.items():
            sent[k[0]] += v[-1][1].get("bytes_acked", 0)
        if not sent:
            continue
        sender = sent.most_common(1)[0][0]
        for k, v in socks.items():
            if k[0] != sender or v[-1][1].get("data_segs_out", 0) < 1000:
                continue
            for t, d in v:
                by[round(t, 1)][k] = d
        ts = sorted(by)
        if not ts:
            continue
        acked = [sum(d.get("bytes_acked", 0) for d in by[t].values()) for t in ts]
        t0 = next((t for t, a in zip(ts, acked) if a > 256e3), None)
        if t0 is None:
            continue
        end = max(t for t in ts if acked[ts.index(t)] < acked[-1]) if acked[-1] else ts[-1]
        w = [t for t in ts if t0 + 3 <= t <= end - 0.5]
        if len(w) < 2:
            continue
        cw = sum(sum(d.get("cwnd", 0) for d in by[t].values()) for t in w) / len(w)
        a0 = sum(d.get("bytes_acked", 0) for d in by[w[0]].values())
        a1 = sum(d.get("bytes_acked", 0) for d in by[w[-1]].values())
        mb = (a1 - a0) / (w[-1] - w[0]) / 1e6
        starved = sum(1 for t in w for d in by[t].values()
                      if d.get("notsent", 0) < 1448 * d.get("cwnd", 0))
        total = sum(len(by[t]) for t in w)

        def retr(x):
            t = min(ts, key=lambda s: abs(s - (t0 + x)))
            return sum(d.get("bytes_retrans", 0) / 1448 for d in by[t].values())

        peak = max(sum(d.get("cwnd", 0) for d in by[t].values()) for t in ts if t < t0 + 3)
        print(f"{fn.rsplit('/', 1)[-1]:<44} sum cwnd {cw:5.0f}  MB/s {mb:5.2f}  "
              f"per cwnd {mb / cw if cw else 0:.4f}  not backlogged {starved}/{total}  "
              f"retrans 1/2/3 s {retr(1):.0f}/{retr(2):.0f}/{retr(3):.0f} end {retr(1e9):.0f}  "
              f"peak cwnd <3 s {peak:.0f}")


if __name__ == "__main__":
    main()
