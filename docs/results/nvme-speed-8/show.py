#!/usr/bin/env python3
"""show.py COUNTS.jsonl: count.sh's per-command counts, one line per run and side (task-clock
in µs per command; the rest per command)."""
import json
import sys

KEYS = [("task-clock", "cpu_us", 1000.0), ("context-switches", "cs", 1), ("cpu-migrations", "migr", 1),
        ("sched_wakeup", "wakeups", 1), ("sys_enter", "syscalls", 1), ("sys_enter_writev", "writev", 1),
        ("sys_enter_recvfrom", "recvfrom", 1), ("sys_enter_epoll_wait", "epoll", 1),
        ("sys_enter_futex", "futex", 1), ("sys_enter_write", "write", 1)]
print("run side mib_s load " + " ".join(k[1] for k in KEYS))
for line in open(sys.argv[1]):
    r = json.loads(line)
    for side in ("bench", "target"):
        x = r[side]
        print(r["run"], side, r["mib_s"], r["loadavg"][0],
              " ".join(f"{x.get(k, 0) * m:.3f}" for k, _, m in KEYS))
