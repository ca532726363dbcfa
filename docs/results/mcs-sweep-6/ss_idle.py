#!/usr/bin/env python3
"""Per run, from `scripts/bench mcs-sweep --evidence`'s `*.ss.txt` (both ends' `ss -tinm` every
0.2 s): over the data sender's sockets (the initiator's for writes and iperf3), from 3 s after
the first data to 0.5 s before the last sample:

- idle: socket-samples with nothing in the send queue (Send-Q 0),
- idle while another is backed up: idle socket-samples in a sample where another socket of the
  same run has more than 1 MB in its send queue (the CmdSN coupling's signature: a write
  whose command waits behind that backlog holds every later write),
- top share: the median, over samples, of the largest socket's share of the summed send queue
  (1/N when spread evenly),
- idle cuts: a socket's congestion window falling by more than a quarter between two samples
  with no new retransmission (over the whole run): slow start after idle
  (net.ipv4.tcp_slow_start_after_idle halves the window for every retransmission timeout the
  socket sat idle, down to 10 segments).

Usage: ss_idle.py RUN.ss.txt... (prints one line per run)."""
import re
import statistics
import sys


def samples(path):
    out, cur, hdr = [], None, None
    for line in open(path):
        m = re.match(r"t=([\d.]+) ns=(\w+)", line)
        if m:
            if cur:
                out.append(cur)
            cur = {"t": float(m.group(1)), "ns": m.group(2), "socks": {}}
            continue
        if not line.startswith("\t"):
            p = line.split()
            hdr = p if len(p) >= 4 else None
            continue
        if cur is None or hdr is None:
            continue
        port = hdr[2].rsplit(":", 1)[1] if cur["ns"] == "ini" else hdr[3].rsplit(":", 1)[1]
        g = lambda k: (int(m.group(1)) if (m := re.search(r"\b" + k + r":(\d+)", line)) else 0)
        r = re.search(r"retrans:\d+/(\d+)", line)
        cur["socks"][port] = {"sq": int(hdr[1]), "cwnd": g("cwnd"), "acked": g("bytes_acked"),
                              "retr": int(r.group(1)) if r else 0}
    if cur:
        out.append(cur)
    return out


def run(path):
    ini = [s for s in samples(path) if s["ns"] == "ini"]
    # Data sockets: those that carried more than 1 MB (not iperf3's control connection).
    last = {}
    for s in ini:
        for p, v in s["socks"].items():
            last[p] = max(last.get(p, 0), v["acked"])
    data = {p for p, a in last.items() if a > 1_000_000}
    flowing = [s for s in ini if any(v["sq"] > 0 for p, v in s["socks"].items() if p in data)]
    if not flowing:
        return f"{path}: no data"
    t0, t1 = flowing[0]["t"] + 3.0, flowing[-1]["t"] - 0.5
    steady = [s for s in ini if t0 <= s["t"] <= t1]
    n = idle = idle_hol = 0
    shares = []
    for s in steady:
        socks = {p: v for p, v in s["socks"].items() if p in data}
        total = sum(v["sq"] for v in socks.values())
        if total:
            shares.append(max(v["sq"] for v in socks.values()) / total)
        for p, v in socks.items():
            n += 1
            if v["sq"] == 0:
                idle += 1
                if any(w["sq"] > 1_000_000 for q, w in socks.items() if q != p):
                    idle_hol += 1
    restarts, prev = 0, {}
    for s in ini:
        for p, v in s["socks"].items():
            if p in data and p in prev:
                w = prev[p]
                if v["cwnd"] < 0.75 * w["cwnd"] and v["retr"] == w["retr"]:
                    restarts += 1
            prev[p] = v
    return (f"{path}: sockets {len(data)}, socket-samples {n}, idle {idle / max(n, 1):.1%}, "
            f"idle while another is backed up {idle_hol / max(n, 1):.1%}, top share median "
            f"{statistics.median(shares) if shares else 0:.2f}, idle cuts {restarts}")


if __name__ == "__main__":
    for a in sys.argv[1:]:
        print(run(a))
