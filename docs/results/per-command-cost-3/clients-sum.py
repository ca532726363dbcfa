#!/usr/bin/env python3
"""clients-sum.py DIR: per client run of clients-ab.sh, commands (ipsan bench's JSON `ops`;
iscsi-perf: its whole-run iops average x the seconds perf stat measured), MiB/s, and per
command: CPU (perf stat task-clock, start-up included), syscalls, context switches, page faults."""
import glob, json, os, re, sys
d = sys.argv[1]
for f in sorted(glob.glob(os.path.join(d, "stat-*.txt"))):
    side, rep = re.match(r"stat-(\w+)-(\d+)\.txt", os.path.basename(f)).groups()
    v = {}
    for line in open(f):
        m = re.match(r"\s*([\d,.]+)\s+(?:msec\s+)?(\S+)", line)
        if m and not line.strip().startswith("#"):
            try:
                v[m.group(2).split(":")[-1]] = float(m.group(1).replace(",", ""))
            except ValueError:
                pass
        m = re.match(r"\s*([\d.]+) seconds time elapsed", line)
        if m:
            v["elapsed"] = float(m.group(1))
    if side == "perf":
        out = open(os.path.join(d, f"out-perf-{rep}.txt"), errors="replace").read()
        iops = [int(x) for x in re.findall(r"iops average (\d+)", out)]
        n = iops[-1] * v.get("elapsed", 0) if iops else 0
    else:
        n = json.load(open(os.path.join(d, f"bench-{side}-{rep}.json")))["result"]["ops"]
    if not n:
        continue
    mib = n / v.get("elapsed", 1) if side == "perf" else n / v.get("elapsed", 1)
    print(f"rep {rep} {side:4} cmds {n:7.0f} ~{mib:6.0f} MiB/s | CPU {v.get('task-clock', 0) * 1000 / n:6.1f} us/cmd, "
          f"syscalls {v.get('sys_enter', 0) / n:5.2f}, cs {v.get('context-switches', 0) / n:5.2f}, faults {v.get('page-faults', 0) / n:5.2f}")
