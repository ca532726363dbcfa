#!/usr/bin/env python3
"""clients-target-sum.py DIR [BLOCKS]: per run of clients-target.sh, commands (ipsan bench's JSON
`ops`; iscsi-perf: its whole-run iops average x the seconds perf stat measured), MiB/s, and per
command on the client and on the target: CPU (task-clock, us), syscalls (all; recvfrom/readv,
writev/sendmsg, epoll_wait/poll), context switches. BLOCKS: 512-byte blocks per command
(default 2048 = 1 MiB)."""
import glob, json, os, re, statistics, sys
from collections import defaultdict
d = sys.argv[1]
blocks = int(sys.argv[2]) if len(sys.argv) > 2 else 2048


def stat(f):
    v = {}
    for line in open(f):
        m = re.match(r"\s*([\d,.]+)\s+(?:msec\s+)?(\S+)", line)
        if m and not line.strip().startswith("#"):
            try:
                v[m.group(2).split(":")[-1].replace("sys_enter_", "")] = float(m.group(1).replace(",", ""))
            except ValueError:
                pass
        m = re.match(r"\s*([\d.]+) seconds time elapsed", line)
        if m:
            v["elapsed"] = float(m.group(1))
    return v


def per(v, n):
    rx = v.get("recvfrom", 0) + v.get("readv", 0) + v.get("read", 0)
    tx = v.get("writev", 0) + v.get("sendmsg", 0) + v.get("write", 0)
    wt = v.get("epoll_wait", 0) + v.get("poll", 0)
    return (v.get("task-clock", 0) * 1000 / n, v.get("sys_enter", 0) / n, rx / n, tx / n, wt / n,
            v.get("context-switches", 0) / n)


rows = defaultdict(list)
print("side rep   cmds   MiB/s | client: CPU us, sysc, rx, tx, wait, cs | target: CPU us, sysc, rx, tx, wait, cs")
for f in sorted(glob.glob(os.path.join(d, "stat-*.txt"))):
    side, rep = re.match(r"stat-(\w+)-(\d+)\.txt", os.path.basename(f)).groups()
    c = stat(f)
    t = stat(os.path.join(d, f"tstat-{side}-{rep}.txt"))
    if side == "perf":
        out = open(os.path.join(d, f"out-perf-{rep}.txt"), errors="replace").read()
        iops = [int(x) for x in re.findall(r"iops average (\d+)", out)]
        n = iops[-1] * c.get("elapsed", 0) if iops else 0
        mib = iops[-1] * blocks * 512 / 2**20 if iops else 0
    else:
        r = json.load(open(os.path.join(d, f"bench-{side}-{rep}.json")))["result"]
        n, mib = r["ops"], r["throughput_mib_s"]
    if not n:
        continue
    pc, pt = per(c, n), per(t, n)
    rows[side].append((mib, pc, pt))
    print(f"{side:4} {rep:>3} {n:6.0f} {mib:7.0f} | " + " ".join(f"{x:6.2f}" for x in pc) + " | "
          + " ".join(f"{x:6.2f}" for x in pt))
print("\nmedians:")
for side, rs in sorted(rows.items()):
    med = lambda i, j=None: statistics.median(r[i] if j is None else r[i][j] for r in rs)
    print(f"{side:4} MiB/s {med(0):7.0f} | client CPU {med(1,0):6.1f} us sysc {med(1,1):5.2f} cs {med(1,5):5.2f}"
          f" | target CPU {med(2,0):6.1f} us sysc {med(2,1):5.2f} rx {med(2,2):5.2f} tx {med(2,3):5.2f} wait {med(2,4):5.2f} cs {med(2,5):5.2f}")
