#!/usr/bin/env python3
"""sum.py DIR BYTES: per run of clients.sh in DIR (BYTES per command), commands, MiB/s, and per
command on the client and on the target: CPU (task-clock, µs), syscalls (all; receive, send,
wait), context switches; then medians per side and, per rep, each side's commands ÷ the
libiscsi client's (`perf` = iscsi-perf for reads, `qemu` = qemu-img bench for writes) in the
same rep. iscsi-perf's commands: its whole-run "iops average" × the seconds perf stat measured;
qemu-img bench's: its -c count (MiB/s from its "Run completed in" time)."""
import glob, json, os, re, statistics as st, sys
from collections import defaultdict

d, nbytes = sys.argv[1], int(sys.argv[2])


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
    g = lambda *k: sum(v.get(x, 0) for x in k)
    return (g("task-clock") * 1000 / n, g("sys_enter") / n, g("recvfrom", "readv", "read") / n,
            g("writev", "sendmsg", "sendto", "write") / n, g("epoll_wait", "poll", "ppoll") / n,
            g("context-switches") / n)


runs = {}
print("side rep    cmds   MiB/s | client: CPU us, sysc, rx, tx, wait, cs | target: CPU us, sysc, rx, tx, wait, cs")
for f in sorted(glob.glob(os.path.join(d, "stat-*.txt")), key=lambda f: (re.findall(r"-(\d+)\.txt", f)[0].zfill(3), f)):
    side, rep = re.match(r"stat-(\w+)-(\d+)\.txt", os.path.basename(f)).groups()
    c, t = stat(f), stat(os.path.join(d, f"tstat-{side}-{rep}.txt"))
    out = os.path.join(d, f"out-{side}-{rep}.txt")
    if side == "perf":
        iops = [int(x) for x in re.findall(r"iops average (\d+)", open(out, errors="replace").read())]
        n = iops[-1] * c.get("elapsed", 0) if iops else 0
        mib = iops[-1] * nbytes / 2**20 if iops else 0
    elif side == "qemu":
        txt = open(out, errors="replace").read()
        secs = re.findall(r"Run completed in ([0-9.]+) seconds", txt)
        qc = int(re.search(r"QCOUNT=(\d+)", open(os.path.join(d, "run.txt")).read()).group(1))
        n = qc if secs else 0
        mib = qc * nbytes / 2**20 / float(secs[-1]) if secs else 0
    else:
        r = json.load(open(os.path.join(d, f"bench-{side}-{rep}.json")))["result"]
        n, mib = r["ops"], r["throughput_mib_s"]
    if not n:
        print(f"{side:4} {rep:>3} no result")
        continue
    pc, pt = per(c, n), per(t, n)
    runs[(side, int(rep))] = (n, mib, pc, pt)
    print(f"{side:4} {rep:>3} {n:7.0f} {mib:7.0f} | " + " ".join(f"{x:6.2f}" for x in pc) + " | "
          + " ".join(f"{x:6.2f}" for x in pt))
sides = sorted({s for s, _ in runs}, key=lambda s: ["new", "disc", "ref", "perf", "qemu"].index(s))
print("\nmedians [range]:")
for s in sides:
    rs = [v for (x, _), v in runs.items() if x == s]
    med = lambda f: st.median(f(r) for r in rs)
    mibs = [r[1] for r in rs]
    print(f"{s:4} MiB/s {med(lambda r: r[1]):7.0f} [{min(mibs):.0f}-{max(mibs):.0f}] | client CPU {med(lambda r: r[2][0]):6.1f} us"
          f" sysc {med(lambda r: r[2][1]):5.2f} cs {med(lambda r: r[2][5]):5.2f} | target CPU {med(lambda r: r[3][0]):6.1f} us"
          f" sysc {med(lambda r: r[3][1]):5.2f} cs {med(lambda r: r[3][5]):5.2f}")
den = "perf" if "perf" in sides else "qemu" if "qemu" in sides else "ref"
print(f"\nper rep, MiB/s ÷ {den}'s in the same rep:")
reps = sorted({r for _, r in runs})
for s in sides:
    if s == den:
        continue
    rs = [runs[(s, r)][1] / runs[(den, r)][1] for r in reps if (s, r) in runs and (den, r) in runs]
    if rs:
        print(f"{s:4} ÷ {den}: {' '.join(f'{x:.2f}' for x in rs)}; median {st.median(rs):.3f} [{min(rs):.2f}-{max(rs):.2f}]")
