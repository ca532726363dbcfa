#!/usr/bin/env python3
"""Cuts capture.sh's two pcaps down to what the figures and the README use.

Usage: cut.py INI_PCAP TGT_PCAP RESULTS_JSON OUT.csv

- OUT.csv (packets-<D>ms.csv): one row per packet that carries data on the iSCSI
  connections (TCP to port 3260: seal's, and for IPsec the TCP inside the tunnel, seen on
  charon's TUN device) and per ESP-in-UDP datagram (port 4500, the IPsec point's wire), in
  the initiator's namespace (side ini) and the target's (side tgt), for KEEP_S seconds from
  KEEP_FROM_S after t0, each point's first data byte from the target (seen at the initiator)
  past its first SKIP_BYTES (login and the first reads' slow start are behind it):
  point, side, kind (tcp | esp), dir (t2i = target to initiator | i2t), t_s (since t0),
  seq (TCP relative sequence number, bytes; empty for esp), len (TCP payload or UDP
  length, bytes). The two namespaces share the host's clock.
- OUT with -summary.csv: per point, from t0 to the end of the connection (not cut to
  the kept window): what the README quotes (see summary() for each column).

The points are matched to the data connections in run order: the lab opens one iSCSI
connection per point, and each point's connection is the only one moving megabytes.
"""
import csv, json, statistics, subprocess, sys

KEEP_FROM_S, KEEP_S = 0.9, 0.5  # the figures draw 1.0-1.3 s after t0
SKIP_BYTES = 65536
GAP_S = 0.001  # a pause in the target's data longer than this ends a burst

ini_pcap, tgt_pcap, results, out = sys.argv[1:5]
recs = json.load(open(results))
labels = [f"{r['point']['scheme']}@{r['depth_used']}" for r in recs]
rtts = [r.get("calibration", {}).get("rtt_ms") for r in recs]
mbs = [r.get("throughput_mb_s") for r in recs]
FIELDS = ["frame.time_epoch", "ip.src", "tcp.stream", "tcp.srcport", "tcp.seq", "tcp.len",
          "udp.srcport", "udp.length"]


def read(pcap):
    cmd = ["tshark", "-r", pcap, "-Y", "tcp.port == 3260 || udp.port == 4500", "-T", "fields",
           "-E", "separator=,"]
    for f in FIELDS:
        cmd += ["-e", f]
    # The capture ends when the lab deletes its namespace, sometimes mid-packet: tshark then
    # exits 2 after printing every whole packet, which is all we use.
    lines = subprocess.run(cmd, capture_output=True, text=True).stdout.splitlines()
    streams, esp = {}, []
    for line in lines:
        t, src, st, sp, seq, tl, usp, ul = line.split(",")
        t = float(t)
        if st:
            d = "t2i" if sp == "3260" else "i2t"
            streams.setdefault(int(st), []).append((t, d, int(seq), int(tl)))
        elif usp:
            # The target has the address ending .2 on the lab's link.
            esp.append((t, "t2i" if src.endswith(".2") else "i2t", int(ul)))
    data = [p for p in streams.values() if sum(l for _, d, _, l in p if d == "t2i") > 1_000_000]
    data.sort(key=lambda p: p[0][0])
    if len(data) != len(recs):
        sys.exit(f"{pcap}: {len(data)} data connections for {len(recs)} points")
    return data, esp


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def ms(x):
    return round(x * 1000, 3) if x == x else ""


def in_burst_spacing(ts):
    return [b - a for a, b in zip(ts, ts[1:]) if b - a <= GAP_S]


def summary(label, rtt_ms, mb_s, ini, tgt, esp_tgt):
    """ini, tgt: (t, dir, seq, len) of this point's connection from t0 on, at each side."""
    t2i = [(t, l) for t, d, _, l in ini if d == "t2i" and l > 0]
    cmds = [t for t, d, _, l in ini if d == "i2t" and l > 0]
    first, last = t2i[0][0], t2i[-1][0]
    gaps = [b[0] - a[0] for a, b in zip(t2i, t2i[1:])]
    idle = [g for g in gaps if g > GAP_S]
    bursts, start, prev = [], first, first
    for t, _ in t2i[1:]:
        if t - prev > GAP_S:
            bursts.append(prev - start)
            start = t
        prev = t
    bursts.append(prev - start)
    # One command in flight: command k's data come after it and before command k+1, at
    # either side. At the target: command in -> first data out (its read and, for seal,
    # sealing the block). At the initiator: last data in -> next command out (for seal,
    # opening the block).
    tgt_t2i = [t for t, d, _, l in tgt if d == "t2i" and l > 0]
    tgt_cmd = [t for t, d, _, l in tgt if d == "i2t" and l > 0]
    wait, after, at_tgt = [], [], []
    if label.endswith("@1"):
        for c, n in zip(cmds, cmds[1:]):
            resp = [t for t, _ in t2i if c < t < n]
            if resp:
                wait.append(resp[0] - c)
                after.append(n - resp[-1])
        for c, n in zip(tgt_cmd, tgt_cmd[1:]):
            resp = [t for t in tgt_t2i if c < t < n]
            if resp:
                at_tgt.append(resp[0] - c)
    esp_out = [t for t, d, _ in esp_tgt if d == "t2i"]
    return {
        "point": label,
        "lab_mb_s": round(mb_s, 3),
        "calibrated_rtt_ms": round(rtt_ms, 3),
        "trace_s": round(last - first, 3),
        "trace_mb_s": round(sum(l for _, l in t2i) / (last - first) / 1e6, 3),
        "data_packets": len(t2i),
        "median_data_len": med([l for _, l in t2i]),
        "commands": len(cmds),
        # Spacing of the target's data segments inside a burst, as the initiator's TCP sees
        # them (for IPsec: on the TUN device, after the initiator's charon decrypted them).
        "ini_median_spacing_in_burst_ms": ms(med(in_burst_spacing([t for t, _ in t2i]))),
        # Spacing of the target's data as it leaves the target: TCP on its wan0 (seal) or
        # ESP datagrams on its wan0 (IPsec: after its charon encrypted each packet).
        "tgt_median_spacing_in_burst_ms": ms(med(in_burst_spacing(
            esp_out if label.startswith("ipsec") else tgt_t2i))),
        "bursts": len(bursts),
        "median_burst_ms": ms(med(bursts)),
        "median_idle_gap_ms": ms(med(idle)),
        "idle_share": round(sum(idle) / (last - first), 3),
        "ini_median_cmd_to_first_data_ms": ms(med(wait)) if wait else "",
        "tgt_median_cmd_in_to_first_data_out_ms": ms(med(at_tgt)) if at_tgt else "",
        "ini_median_last_data_to_next_cmd_ms": ms(med(after)) if after else "",
    }


ini_data, ini_esp = read(ini_pcap)
tgt_data, tgt_esp = read(tgt_pcap)
summ = []
with open(out, "w", newline="") as o:
    w = csv.writer(o)
    w.writerow(["point", "side", "kind", "dir", "t_s", "seq", "len"])
    for ini, tgt, label, rtt, mb in zip(ini_data, tgt_data, labels, rtts, mbs):
        down = [(t, sq) for t, d, sq, l in ini if d == "t2i" and l > 0]
        t0 = next(t for t, sq in down if sq - down[0][1] >= SKIP_BYTES)
        rows = []
        for side, pkts, esp in (("ini", ini, ini_esp), ("tgt", tgt, tgt_esp)):
            span = (pkts[0][0], pkts[-1][0])
            rows += [(t, side, "tcp", d, sq, l) for t, d, sq, l in pkts if l > 0]
            if label.startswith("ipsec"):
                rows += [(t, side, "esp", d, "", l) for t, d, l in esp if span[0] <= t <= span[1]]
        rows.sort(key=lambda r: r[0])
        for t, side, k, d, sq, l in rows:
            if KEEP_FROM_S <= t - t0 < KEEP_FROM_S + KEEP_S:
                w.writerow([label, side, k, d, f"{t - t0:.6f}", sq, l])
        span = (tgt[0][0], tgt[-1][0])
        esp_t = [x for x in tgt_esp if max(span[0], t0 - 0.1) <= x[0] <= span[1]] \
            if label.startswith("ipsec") else []
        summ.append(summary(label, rtt, mb, [x for x in ini if x[0] >= t0],
                            [x for x in tgt if x[0] >= t0 - 0.1], esp_t))
with open(out.replace(".csv", "-summary.csv"), "w", newline="") as o:
    w = csv.DictWriter(o, fieldnames=list(summ[0]))
    w.writeheader()
    w.writerows(summ)
for r in summ:
    print(r)
