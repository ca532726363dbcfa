#!/usr/bin/python3
"""Draws the papers' packet-timeline figures (001 Fig. 9-11, 004 Fig. 10-15) from the
packets-<D>ms.csv files cut.py wrote: time on x (ms), TCP sequence number of the target's
data on y (KiB from the window's first byte), one panel per scheme and commands in flight;
the initiator's commands (its TCP segments that carry data: SCSI Read commands, sealed for
seal) as red ticks; in orange the same data leaving the target's TCP; for IPsec the ESP
datagrams leaving the target (green rug) and reaching the initiator (grey rug).

Usage: plot.py DIR   (writes timeline-8ms.png, timeline-0ms.png, timeline-zoom-8ms.png)
"""
import csv, os, sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

d = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
ORDER = ["ipsec@1", "seal@1", "seal@2", "seal@3"]
NAME = {"ipsec@1": "IPsec (strongSwan ESP), one command",
        "seal@1": "seal, one command in flight",
        "seal@2": "seal, two commands in flight",
        "seal@3": "seal, three commands in flight"}


def load(delay):
    pts = defaultdict(lambda: {"data": [], "cmd": [], "esp": [], "tdata": [], "tesp": []})
    summ = {r["point"]: r for r in csv.DictReader(open(f"{d}/packets-{delay}ms-summary.csv"))}
    for r in csv.DictReader(open(f"{d}/packets-{delay}ms.csv")):
        p = pts[r["point"]]
        t = float(r["t_s"]) * 1000
        tgt = r["side"] == "tgt"
        if r["kind"] == "esp":
            if r["dir"] == "t2i":
                p["tesp" if tgt else "esp"].append(t)
        elif r["dir"] == "t2i":
            p["tdata" if tgt else "data"].append((t, int(r["seq"])))
        elif not tgt:
            p["cmd"].append(t)
    return pts, summ


def panel(ax, p, lo, hi, label, s):
    data = [(t, q) for t, q in p["data"] if lo <= t <= hi]
    if not data:
        return
    q0 = data[0][1]
    tdata = [(t, q) for t, q in p["tdata"] if lo <= t <= hi and q >= q0]
    if tdata:
        ax.plot([t for t, _ in tdata], [(q - q0) / 1024 for _, q in tdata], ".", ms=2,
                color="tab:orange", alpha=0.6,
                label="the same segment leaving the target's TCP (target's namespace)")
    ax.plot([t for t, _ in data], [(q - q0) / 1024 for _, q in data], ".", ms=2.5,
            color="tab:blue", label="data segment reaching the initiator's TCP (initiator's namespace)")
    top = (data[-1][1] - q0) / 1024
    cm = [t for t in p["cmd"] if lo <= t <= hi]
    if cm:
        ax.plot(cm, [top * 1.04] * len(cm), "v", ms=5, color="tab:red",
                label="initiator's command (TCP segment with data)")
    tesp = [t for t in p["tesp"] if lo <= t <= hi]
    if tesp:
        ax.plot(tesp, [-top * 0.12] * len(tesp), "|", ms=6, color="tab:green",
                label="ESP datagram leaving the target (its charon encrypted it)")
    esp = [t for t in p["esp"] if lo <= t <= hi]
    if esp:
        ax.plot(esp, [-top * 0.05] * len(esp), "|", ms=6, color="0.4",
                label="ESP datagram reaching the initiator (before its charon decrypts it)")
    ax.set_title(f"{NAME.get(label, label)}: {float(s['trace_mb_s']):.2f} MB/s in the trace",
                 fontsize=9, loc="left")
    ax.set_ylabel("sequence (KiB)")
    ax.set_xlim(lo, hi)
    ax.grid(alpha=0.3)


def figure(delay, lo, hi, labels, out, title):
    pts, summ = load(delay)
    labels = [l for l in labels if l in pts]
    fig, axes = plt.subplots(len(labels), 1, figsize=(11, 2.3 * len(labels) + 1.3),
                             sharex=True, squeeze=False)
    for ax, l in zip(axes[:, 0], labels):
        panel(ax, pts[l], lo, hi, l, summ[l])
    axes[-1, 0].set_xlabel("ms since t0 (the first data byte from the target past its first 64 KiB)")
    handles = {}
    for ax in axes[:, 0]:
        for h, n in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(n, h)
    # Title and legend above the panels, in fixed inches whatever the figure's height.
    hgt = fig.get_figheight()
    fig.suptitle(title, fontsize=9.5, y=1 - 0.08 / hgt, va="top")
    fig.legend(list(handles.values()), list(handles), loc="upper center", ncol=2,
               fontsize=8, bbox_to_anchor=(0.5, 1 - 0.55 / hgt), frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.85 / hgt))
    fig.savefig(f"{d}/{out}", dpi=110)
    plt.close(fig)


TAIL = ("64 KiB sequential 3DES-CBC + HMAC-SHA1-96 reads, captured in the initiator's namespace\n"
        "(ipsan lab, one crypto worker per host, shared 2-vCPU host, load average 3.9-4.5)")
figure("8", 1000, 1300, ORDER, "timeline-8ms.png",
       f"8 ms one way (001 Fig. 9-11, 004 Fig. 12-15): {TAIL}")
figure("0", 1000, 1300, ORDER, "timeline-0ms.png",
       f"0 ms (004 Fig. 10-11; seal @2, @3 beside them): {TAIL}")
figure("8", 1000, 1060, ["ipsec@1", "seal@1"], "timeline-zoom-8ms.png",
       "8 ms one way, 60 ms of it: IPsec carries each 64 KiB as ~1,350-byte packets spread "
       "apart as charon\nencrypts and decrypts each; seal's leaves and arrives in one burst "
       "after the target sealed the whole block")
