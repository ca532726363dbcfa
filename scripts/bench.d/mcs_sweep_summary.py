#!/usr/bin/env python3
"""summary.md of `scripts/bench mcs-sweep` runs: `mcs_sweep_summary.py DIR [DIR...]` merges the
raw.jsonl of every DIR (e.g. a 100 Mbit/s run and a 1 Gbit/s run) and prints, per cell, the
medians with ranges of iperf3 -P N, sealed writes and reads through N connections, ipsan ÷
iperf3 and N ÷ 1 connection, against issue 28's goals. Reads are compared with `iperf3 -R`
(side `iperf3r`, the data going their way) in the cells that ran it, else with `iperf3`."""

import json
import os
import re
import statistics
import sys

SIDES = ("iperf3", "iperf3r", "write", "read")
# A second build's sides (`scripts/bench mcs-sweep --bin-b`).
SIDES_B = ("write-b", "read-b")


def rate_bps(rate):
    m = re.fullmatch(r"([0-9.]+)(kbit|mbit|gbit)", rate)
    return float(m.group(1)) * {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}[m.group(2)] if m else None


def goodput(rate):
    """The link's TCP goodput in MB/s: IP bytes at the rate, 1448 of every 1500 data."""
    b = rate_bps(rate)
    return b / 8 / 1e6 * 1448 / 1500 if b else None


def loss_key(loss):
    """A cell's loss, each way (`0.1%`) or one way only (`down:0.1%`, after the others)."""
    way, _, p = loss.rpartition(":")
    return (float(p.rstrip("%")), way)


def rng(v, f="{:.2f}"):
    if not v:
        return "–"
    return f"{f.format(statistics.median(v))} [{f.format(min(v))}–{f.format(max(v))}]"


def summary(dirs):
    rows = []
    for d in dirs:
        p = os.path.join(d, "raw.jsonl")
        if os.path.exists(p):
            rows += [json.loads(l) for l in open(p) if l.strip()]
    ok = [r for r in rows if "error" not in r]
    bad = [r for r in rows if "error" in r]
    cells = sorted({(r["cc"], r["rate"], r["loss"], r["n"]) for r in rows},
                   key=lambda c: (c[0] != "cubic", c[0], rate_bps(c[1]) or 0, loss_key(c[2]), c[3]))
    sel = {}
    for c in cells:
        for s in SIDES + SIDES_B:
            sel[c, s] = sorted((r for r in ok if (r["cc"], r["rate"], r["loss"], r["n"]) == c
                                and r["side"] == s), key=lambda r: r["rep"])

    def vals(c, s, key="mb_s"):
        return [r[key] for r in sel.get((c, s), []) if r.get(key) is not None]

    def med(c, s, key="mb_s"):
        v = vals(c, s, key)
        return statistics.median(v) if v else None

    def per_rep(c, s, base, key="mb_s"):
        a = {r["rep"]: r[key] for r in sel.get((c, s), []) if r.get(key) is not None}
        b = {r["rep"]: r[key] for r in sel.get((c, base), []) if r.get(key) is not None}
        return [a[k] / b[k] for k in a if k in b and b[k]]

    def ratio(c, s, base, key):
        m, i = med(c, s, key), med(c, base, key)
        if m is None or not i:
            return "–"
        pr = per_rep(c, s, base, key)
        mark = "✓" if m / i >= 0.9 else "✗"
        return f"{m / i:.2f} {mark} [{min(pr):.2f}–{max(pr):.2f}]" if pr else f"{m / i:.2f} {mark}"

    def ref(c, s):
        """What side `s` is compared with: iperf3 with its data going the same way."""
        return "iperf3r" if s.startswith("read") and sel.get((c, "iperf3r")) else "iperf3"

    def cpu(c, s):
        v = [(r["sender_cpu_s"] + r["receiver_cpu_s"]) / (r["bytes"] / 1e9)
             for r in sel.get((c, s), []) if r["bytes"]]
        return f"{statistics.median(v):.1f}" if v else "–"

    out = []
    out.append("Past slow start (the issue's comparison): wire MB/s = 10^6 IP bytes per second the "
               "emulator delivered in the data's direction, from 3 s after the data began to flow "
               "to 0.5 s before the run's time was up, sampled every 0.2 s (`*.wan.jsonl`), the "
               "same for both tools; median [min–max] over the reps, ratios of the medians with "
               "the per-rep ratios' range. ✓ / ✗: the goal of ≥ 0.9× iperf3 with as many "
               "streams.\n")
    out.append("| cc | rate | loss | N | reps | iperf3 -P N | iperf3 -R -P N | write | read | "
               "write ÷ iperf3 | read ÷ iperf3 (-R where run) | late > 5 ms (emulator) | "
               "1-min load |")
    out.append("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for c in cells:
        loads = [float(r["loadavg_before"].split()[0]) for s in SIDES for r in sel[c, s]]
        late = [r["late_5ms_share"] for s in SIDES for r in sel[c, s] if r.get("late_5ms_share") is not None]
        nreps = min((len(sel[c, s]) for s in SIDES if sel[c, s]), default=0)
        if not loads:
            continue
        out.append(f"| {c[0]} | {c[1]} | {c[2]} | {c[3]} | {nreps} | "
                   f"{rng(vals(c, 'iperf3', 'steady_wire_mb_s'))} | "
                   f"{rng(vals(c, 'iperf3r', 'steady_wire_mb_s'))} | "
                   f"{rng(vals(c, 'write', 'steady_wire_mb_s'))} | "
                   f"{rng(vals(c, 'read', 'steady_wire_mb_s'))} | "
                   f"{ratio(c, 'write', 'iperf3', 'steady_wire_mb_s')} | "
                   f"{ratio(c, 'read', ref(c, 'read'), 'steady_wire_mb_s')} | "
                   f"{100 * statistics.median(late):.2f} % | "
                   f"{min(loads):.1f}–{max(loads):.1f} |" if late else
                   f"| {c[0]} | {c[1]} | {c[2]} | {c[3]} | {nreps} | – | – | – | – | – | – | – | "
                   f"{min(loads):.1f}–{max(loads):.1f} |")

    out.append("\nWhole runs as each tool reports them (slow start included; the bench's rate "
               "counts the commands still in flight at the end too): MB/s of data, CPU-s/GB "
               "sender + receiver (bench + target for ipsan, client + server for iperf3):\n")
    out.append("| cc | rate | loss | N | iperf3 -P N MB/s | iperf3 -R -P N MB/s | write MB/s | "
               "read MB/s | write ÷ iperf3 | read ÷ iperf3 (-R where run) | "
               "CPU-s/GB iperf3 / write / read |")
    out.append("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for c in cells:
        out.append(f"| {c[0]} | {c[1]} | {c[2]} | {c[3]} | "
                   f"{rng(vals(c, 'iperf3'))} | {rng(vals(c, 'iperf3r'))} | {rng(vals(c, 'write'))} | "
                   f"{rng(vals(c, 'read'))} | {ratio(c, 'write', 'iperf3', 'mb_s')} | "
                   f"{ratio(c, 'read', ref(c, 'read'), 'mb_s')} | "
                   f"{cpu(c, 'iperf3')} / {cpu(c, 'write')} / {cpu(c, 'read')} |")

    K = "steady_wire_mb_s"
    out.append("\nN ÷ 1 connection (stream) per link, past slow start (wire MB/s as above), medians; "
               "at 1 % loss the goal is 8 connections ≥ 4× one or the link (its rate in wire "
               "bytes), whichever is lower:\n")
    out.append("| cc | rate | loss | N | iperf3 ÷ 1 | write ÷ 1 | read ÷ 1 | goal (1 % loss, N = 8) |")
    out.append("|---|---|---|---:|---:|---:|---:|---|")
    for c in cells:
        one = (c[0], c[1], c[2], 1)
        if c[3] == 1 or one not in cells:
            continue
        cols = []
        for s in ("iperf3", "write", "read"):
            m, b = med(c, s, K), med(one, s, K)
            cols.append(f"{m / b:.2f}" if m is not None and b else "–")
        goal = ""
        if loss_key(c[2]) == (1.0, "") and c[3] == 8:
            gp = goodput(c[1]) * 1500 / 1448 if goodput(c[1]) else None  # wire bytes
            marks = []
            for s in ("write", "read"):
                m, b = med(c, s, K), med(one, s, K)
                if m is None or not b:
                    continue
                need = min(4 * b, gp) if gp else 4 * b
                marks.append(f"{s} {m:.2f} vs {need:.2f} {'✓' if m >= need else '✗'}")
            goal = "; ".join(marks)
        out.append(f"| {c[0]} | {c[1]} | {c[2]} | {c[3]} | {' | '.join(cols)} | {goal} |")

    if any(r["side"] in SIDES_B for r in rows):
        out.append("\nThe two builds side by side (--bin against --bin-b, alternated in one run), "
                   "past slow start (wire MB/s as above), median [min–max]; ratios of the medians "
                   "with the per-rep ratios' range:\n")
        out.append("| cc | rate | loss | N | write | write (b) | write ÷ b | write (b) ÷ iperf3 "
                   "| read | read (b) | read ÷ b | read (b) ÷ iperf3 (-R where run) | CPU-s/GB write / b / "
                   "read / b |")
        out.append("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for c in cells:
            if not any(sel[c, s] for s in SIDES_B):
                continue
            out.append(f"| {c[0]} | {c[1]} | {c[2]} | {c[3]} | "
                       f"{rng(vals(c, 'write', K))} | {rng(vals(c, 'write-b', K))} | "
                       f"{ratio(c, 'write', 'write-b', K)} | {ratio(c, 'write-b', 'iperf3', K)} | "
                       f"{rng(vals(c, 'read', K))} | {rng(vals(c, 'read-b', K))} | "
                       f"{ratio(c, 'read', 'read-b', K)} | {ratio(c, 'read-b', ref(c, 'read-b'), K)} | "
                       f"{cpu(c, 'write')} / {cpu(c, 'write-b')} / {cpu(c, 'read')} / "
                       f"{cpu(c, 'read-b')} |")

    if bad:
        out.append("\nRuns that failed (not in the medians):\n")
        for r in bad:
            out.append(f"- {r['cc']} {r['rate']} loss {r['loss']} N={r['n']} {r['side']} rep "
                       f"{r['rep']}: {r['error']}")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    sys.stdout.write(summary(sys.argv[1:]))
