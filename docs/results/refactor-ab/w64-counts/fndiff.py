#!/usr/bin/env python3
"""fndiff.py LO.out HI.out DN [LO2.out HI2.out DN2] [--top K] [--inclusive]: callgrind's
instructions per command by function ((HI - LO) / DN, from callgrind_annotate); with a second
pair, both side by side and their difference, largest differences first."""
import re
import subprocess
import sys
from collections import defaultdict

args = [a for a in sys.argv[1:] if not a.startswith("--")]
top = 40
for a in sys.argv[1:]:
    if a.startswith("--top="):
        top = int(a.split("=")[1])
incl = "--inclusive" in sys.argv


def fns(f):
    cmd = ["callgrind_annotate", "--threshold=100", f"--inclusive={'yes' if incl else 'no'}", f]
    out = subprocess.run(cmd, capture_output=True, text=True).stdout
    r = defaultdict(float)
    for line in out.splitlines():
        m = re.match(r"\s*([\d,]+)\s+(?:\([^)]*\)\s+)?(\S.*)$", line)
        if not m or ":" not in m.group(2):
            continue
        name = m.group(2)
        name = re.sub(r" \[[^\]]*\]$", "", name)  # the object file
        name = name.split(":", 1)[1] if not name.startswith("???") else name
        r[name] += float(m.group(1).replace(",", ""))
    return r


def per(lo, hi, dn):
    a, b = fns(lo), fns(hi)
    return {k: (b.get(k, 0) - a.get(k, 0)) / dn for k in set(a) | set(b)}


p1 = per(args[0], args[1], float(args[2]))
if len(args) >= 6:
    p2 = per(args[3], args[4], float(args[5]))
    keys = sorted(set(p1) | set(p2), key=lambda k: -abs(p1.get(k, 0) - p2.get(k, 0)))
    print(f"{'A':>10} {'B':>10} {'A-B':>10}  function (instructions per command)")
    print(f"{sum(p1.values()):10.0f} {sum(p2.values()):10.0f} {sum(p1.values()) - sum(p2.values()):10.0f}  (sum)")
    for k in keys[:top]:
        print(f"{p1.get(k, 0):10.0f} {p2.get(k, 0):10.0f} {p1.get(k, 0) - p2.get(k, 0):10.0f}  {k[:150]}")
else:
    for k in sorted(p1, key=lambda k: -p1[k])[:top]:
        print(f"{p1[k]:10.0f}  {k[:150]}")
