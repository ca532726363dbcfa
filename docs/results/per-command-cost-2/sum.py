#!/usr/bin/env python3
"""sum.py DIR NCMDS: per-command counts from w64.sh's perf stat files."""
import glob, os, re, sys
d, n = sys.argv[1], int(sys.argv[2])
for f in sorted(glob.glob(os.path.join(d, "stat-*.txt"))):
    vals = {}
    for line in open(f):
        m = re.match(r"\s*([\d,.]+)\s+(?:msec\s+)?(\S+)", line)
        if m and not line.strip().startswith("#"):
            try:
                vals[m.group(2).split(":")[-1]] = float(m.group(1).replace(",", ""))
            except ValueError:
                pass
    keep = {k: v / n for k, v in vals.items() if v}
    print(os.path.basename(f), " ".join(f"{k.replace('sys_enter_','')}={v:.2f}" for k, v in keep.items()))
for f in sorted(glob.glob(os.path.join(d, "out-qemu-*.txt"))):
    print(f, open(f).read().strip().splitlines()[-1:])
