#!/usr/bin/env python3
"""The data sender's socket over one run, from `perf record -a -e tcp:tcp_probe -e
sock:sock_send_length` (trace.sh): every ACK the sender takes in (`tcp_probe`: snd_una,
snd_nxt, cwnd, srtt) and every write to the socket (`sock_send_length`: its length).

Usage: probe.py RUN.perf.data > RUN.probe.csv   (then gzip)

The sender's socket is the one with the most ACKs. One row per millisecond at most (the last
ACK of it), columns: t (s from the socket's first ACK), una and nxt (bytes, from the first
ACK's snd_una), cwnd (segments), srtt_us, written (bytes written to the socket by then, on
the same origin: the offset is the least of written - nxt over the run, i.e. the moments with
nothing unsent), ssthresh (segments)."""
import bisect
import re
import subprocess
import sys


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = subprocess.run(["perf", "script", "-i", sys.argv[1], "-F", "time,event,trace"],
                         capture_output=True, text=True, check=True).stdout
    probes, writes = {}, {}
    for line in out.splitlines():
        m = re.match(r"\s*([\d.]+):\s+(\S+):\s+(.*)", line)
        if not m:
            continue
        t, ev, tr = float(m.group(1)), m.group(2), m.group(3)
        if ev.startswith("tcp:tcp_probe"):
            f = dict(re.findall(r"(\w+)=(\S+)", tr))
            probes.setdefault(f["skaddr"], []).append(
                (t, int(f["snd_una"], 16), int(f["snd_nxt"], 16), int(f["snd_cwnd"]), int(f["srtt"]),
                 int(f["ssthresh"])))
        elif ev.startswith("sock:sock_send_length"):
            w = re.search(r"sk address = (\S+),.*length = (-?\d+)", tr)
            if w:
                writes.setdefault(w.group(1), []).append((t, max(0, int(w.group(2)))))
    sk = max(probes, key=lambda k: len(probes[k]))
    ps, ws = probes[sk], writes.get(sk, [])
    t0, base = ps[0][0], ps[0][1]
    wt = [t for t, _ in ws]
    cum, c = [], 0
    for _, n in ws:
        c += n
        cum.append(c)

    def written(t):
        i = bisect.bisect_right(wt, t)
        return cum[i - 1] if i else 0

    rel = [(t, (u - base) & 0xFFFFFFFF, (n - base) & 0xFFFFFFFF, cw, s, st) for t, u, n, cw, s, st in ps]
    off = min(written(t) - n for t, _, n, _, _, _ in rel)
    print("t,una,nxt,cwnd,srtt_us,written,ssthresh")
    rows = []
    for r in rel:
        ms = int((r[0] - t0) * 1000)
        if rows and rows[-1][0] == ms:
            rows[-1] = (ms, r)
        else:
            rows.append((ms, r))
    for _, (t, u, n, cw, s, st) in rows:
        print(f"{t - t0:.4f},{u},{n},{cw},{s},{written(t) - off},{st}")


if __name__ == "__main__":
    main()
