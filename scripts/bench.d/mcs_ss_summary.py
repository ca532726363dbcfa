#!/usr/bin/env python3
"""What each connection of a `scripts/bench mcs-sweep --evidence` run did, from its `ss -tinm`
samples (`<run>.ss.txt`, both ends every 0.2 s): `mcs_ss_summary.py RUN.ss.txt [--side ini|tgt]
[--series]`.

Per connection (named by the initiator's port), on the side that sends the data (ini for
writes and iperf3, tgt for reads; --side overrides): MB acknowledged, its share, the share of
samples in which it moved nothing while it had nothing queued (idle: Send-Q 0) or while it had
data queued (stalled), cwnd median / max, retransmitted segments, and the kernel's busy,
rwnd-limited and sndbuf-limited times. --series prints every sample (t, MB acked so far, cwnd,
Send-Q, unacked) per connection as well."""

import re
import statistics
import sys


def parse(path):
    """{(side, ini_port): [(t, fields)]}"""
    out = {}
    t = side = None
    cur = None
    for line in open(path):
        m = re.match(r"t=([0-9.]+) ns=(\w+)", line)
        if m:
            t, side = float(m.group(1)), m.group(2)
            cur = None
            continue
        if not line.strip():
            continue
        if not line[0].isspace():
            f = line.split()
            if len(f) < 4:
                continue
            local, peer = f[2], f[3]
            port = (local if side == "ini" else peer).rsplit(":", 1)[1]
            cur = {"recvq": int(f[0]), "sendq": int(f[1])}
            out.setdefault((side, port), []).append((t, cur))
            continue
        if cur is None:
            continue
        for k, v in re.findall(r"([a-z_]+):([0-9./()%,a-z]+)", line):
            cur[k] = v
        m = re.search(r"busy:(\d+)ms", line)
        if m:
            cur["busy_ms"] = int(m.group(1))
    return out


def num(x, default=0):
    try:
        return float(str(x).split("/")[0].split("(")[0].rstrip("ms"))
    except (TypeError, ValueError):
        return default


def main():
    args = sys.argv[1:]
    if not args:
        sys.exit(__doc__)
    path = args[0]
    side = None
    if "--side" in args:
        side = args[args.index("--side") + 1]
    if side is None:
        side = "tgt" if "-read" in path else "ini"
    series = "--series" in args
    data = {k: v for k, v in parse(path).items() if k[0] == side}
    total = sum(num(v[-1][1].get("bytes_acked")) - num(v[0][1].get("bytes_acked"))
                for v in data.values()) or 1
    print(f"{path} ({side} side, {len(data)} connections)")
    print("| port | MB acked | share | idle | stalled | cwnd median / max | retrans | busy s | "
          "rwnd-limited s | sndbuf-limited s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for (s, port), v in sorted(data.items()):
        acked = [num(f.get("bytes_acked")) for _, f in v]
        idle = stalled = 0
        for i in range(1, len(v)):
            moved = acked[i] > acked[i - 1]
            if not moved:
                if v[i][1]["sendq"] == 0:
                    idle += 1
                else:
                    stalled += 1
        n = max(1, len(v) - 1)
        cw = [num(f.get("cwnd")) for _, f in v if "cwnd" in f]
        last = v[-1][1]
        retrans = str(last.get("retrans", "0/0")).split("/")[-1]
        print(f"| {port} | {(acked[-1] - acked[0]) / 1e6:.2f} | "
              f"{(acked[-1] - acked[0]) / total:.2f} | {idle / n:.2f} | {stalled / n:.2f} | "
              f"{statistics.median(cw) if cw else 0:.0f} / {max(cw) if cw else 0:.0f} | {retrans} | "
              f"{last.get('busy_ms', 0) / 1e3:.1f} | {num(last.get('rwnd_limited')) / 1e3:.1f} | "
              f"{num(last.get('sndbuf_limited')) / 1e3:.1f} |")
    if series:
        for (s, port), v in sorted(data.items()):
            print(f"\n{port}: t MB-acked cwnd send-q unacked")
            t0 = v[0][0]
            for t, f in v:
                print(f"{t - t0:7.2f} {num(f.get('bytes_acked')) / 1e6:8.2f} "
                      f"{num(f.get('cwnd')):5.0f} {f['sendq']:9d} {num(f.get('unacked')):5.0f}")


if __name__ == "__main__":
    main()
