#!/usr/bin/env python3
"""004 Fig. 9: the lab target's CPU once a second.

Usage: sample.py LAB_PID OUT.csv — polls the processes in the lab's target namespace
(`ipsanlab<LAB_PID>-tgt`, the namespace `ipsan lab run` with that pid creates) every second
until LAB_PID exits, and writes one row per process and second: the time since the first
sample, the pid, its command line (short) and its CPU in % of one core over that second
(utime + stime from /proc/PID/stat).
"""
import os, sys, time

lab, out = int(sys.argv[1]), sys.argv[2]
ns_path = f"/run/netns/ipsanlab{lab}-tgt"
hz = os.sysconf("SC_CLK_TCK")


def ticks(pid):
    with open(f"/proc/{pid}/stat") as f:
        rest = f.read().rsplit(")", 1)[1].split()
    return int(rest[11]) + int(rest[12])


def in_ns(ino):
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                if os.stat(f"/proc/{p}/ns/net").st_ino == ino:
                    yield int(p)
            except OSError:
                pass


t0 = time.monotonic()
last = {}
with open(out, "w") as o:
    o.write("unix_s,pid,cmd,cpu_pct\n")
    while os.path.exists(f"/proc/{lab}"):
        now = time.monotonic()
        try:
            ino = os.stat(ns_path).st_ino
        except OSError:
            time.sleep(0.2)
            continue
        for pid in in_ns(ino):
            try:
                t = ticks(pid)
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
            except OSError:
                continue
            if pid in last:
                t1, k1 = last[pid]
                pct = (t - k1) / hz / (now - t1) * 100
                short = " ".join(cmd.split()[:2])
                o.write(f"{time.time():.2f},{pid},{short},{pct:.1f}\n")
            last[pid] = (now, t)
        o.flush()
        time.sleep(max(0.0, 1.0 - (time.monotonic() - now)))
