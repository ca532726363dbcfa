#!/usr/bin/env python3
"""n2.py DIR... : per command counts of the long runs alone (count / N at N = 60000, start-up
and login included, ~0.3 % of it), 4 KiB x 32 writes, per run, target and client, grouped by
label kind (base*, look*/x1look*/new*): robust where a short run fell in another regime than
its long one, which the difference of the two counts (sum.py) does not see."""
import glob, os, re, statistics as st, sys

KEYS = ["raw_syscalls:sys_enter", "context-switches", "syscalls:sys_enter_writev",
        "syscalls:sys_enter_recvfrom", "syscalls:sys_enter_epoll_wait"]
rows = []
for d in sys.argv[1:]:
    for f in sorted(glob.glob(os.path.join(d, "perf-*-write4KiB-d32-60000.txt"))):
        m = re.match(r"perf-(target|bench)-(\S+)-qemu-write4KiB-d32-60000.txt", os.path.basename(f))
        side, lab = m.groups()
        kind = "base" if lab.startswith("base") else ("look" if re.match(r"(look|x1look|new)", lab) else None)
        if not kind:
            continue
        v = {}
        for line in open(f):
            p = line.split()
            if len(p) >= 2 and p[1] in KEYS:
                v[p[1]] = int(p[0].replace(",", "")) / 60000
        rows.append((os.path.basename(d.rstrip("/")), lab, side, kind, v))
for r in rows:
    print(f"{r[0]:12} {r[1]:10} {r[2]:6} " + " ".join(f"{k.split(':')[-1].replace('sys_enter_','')} {r[4].get(k, 0):.3f}" for k in KEYS))
print()
for side in ("target", "bench"):
    for k in KEYS:
        for kind in ("base", "look"):
            xs = [r[4].get(k, 0) for r in rows if r[2] == side and r[3] == kind]
            if xs:
                print(f"{side:6} {k.split(':')[-1]:28} {kind}: n={len(xs):2} median {st.median(xs):.3f} range {min(xs):.3f}-{max(xs):.3f}")
