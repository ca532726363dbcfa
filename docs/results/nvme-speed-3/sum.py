#!/usr/bin/env python3
"""sum.py DIR: per-command counts from prof.sh's perf stat files and bench reports in DIR."""
import glob
import json
import os
import re
import sys

d = sys.argv[1]


def stat(f):
    r = {}
    if not os.path.exists(f):
        return r
    for line in open(f):
        m = re.match(r"\s*([\d,.]+)\s+(msec\s+)?(\S+)", line)
        if m:
            try:
                r[m.group(3)] = float(m.group(1).replace(",", ""))
            except ValueError:
                pass
    return r


KEYS = [("context-switches", "cs"), ("raw_syscalls:sys_enter", "sys"),
        ("syscalls:sys_enter_read", "read"), ("syscalls:sys_enter_recvfrom", "recvfrom"),
        ("syscalls:sys_enter_write", "write"), ("syscalls:sys_enter_writev", "writev"),
        ("syscalls:sys_enter_sendmsg", "sendmsg"), ("syscalls:sys_enter_epoll_wait", "epoll"),
        ("syscalls:sys_enter_futex", "futex")]
print("per command; task-clock in us")
for j in sorted(glob.glob(f"{d}/bench-*.json")):
    name = os.path.basename(j)[6:-5]
    res = json.load(open(j))["result"]
    ops = res.get("ops") or 1
    for side in ("bench", "target"):
        s = stat(f"{d}/stat-{side}-{name}.txt")
        cols = " ".join(f"{short} {s.get(k, 0) / ops:5.2f}" for k, short in KEYS)
        print(f"{name:28} {side:6} {res['throughput_mib_s']:8.1f} MiB/s ops {ops:7d} "
              f"task-clock {s.get('task-clock', 0) * 1e3 / ops:6.2f} {cols}")
