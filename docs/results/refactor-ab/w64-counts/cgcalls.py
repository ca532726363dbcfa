#!/usr/bin/env python3
"""cgcalls.py CALLEE_SUBSTR A_LO A_HI DN [B_LO B_HI DN]: calls per command to functions whose
name contains CALLEE_SUBSTR and their inclusive instructions per command, by calling source
line (inlined code where written), (HI - LO) / DN; with a second pair, side by side."""
import gzip
import re
import sys
from collections import defaultdict

sys.path.insert(0, __import__("os").path.dirname(__file__))
from cgfiles import norm  # noqa: E402

callee = sys.argv[1]
args = sys.argv[2:]


def parse(f):
    names = {}
    fnames = {}
    out = defaultdict(lambda: [0.0, 0.0])
    fl = fi = fn = None
    last = 0
    pending = None
    for line in (gzip.open(f, "rt", errors="replace") if f.endswith(".gz") else open(f, errors="replace")):
        line = line.rstrip("\n")
        if not line:
            continue
        c = line[0]
        if c.isdigit() or c in "+-*":
            parts = line.split()
            p = parts[0]
            pos = last if p == "*" else (last + int(p) if p[0] in "+-" else int(p))
            last = pos
            if pending is not None:
                n, name = pending
                pending = None
                if callee in name:
                    k = (fi or fl, pos, fn)
                    out[k][0] += n
                    out[k][1] += float(parts[1]) if len(parts) > 1 else 0
            continue
        m = re.match(r"(fl|fi|fe|fn|cfi|cfl|cfn|ob|cob)=\((\d+)\)(?: (.*))?$", line)
        if m:
            kind, ident, name = m.groups()
            if kind in ("fn", "cfn"):
                if name is not None:
                    fnames[ident] = name
                name = fnames.get(ident, "?")
                if kind == "fn":
                    fn, fi = name, None
                else:
                    cfn = name
            elif kind in ("fl", "fi", "fe", "cfi", "cfl"):
                if name is not None:
                    names[ident] = name
                name = norm(names.get(ident, "?"))
                if kind == "fl":
                    fl, fi = name, None
                elif kind in ("fi", "fe"):
                    fi = None if name == fl else name
            continue
        if line.startswith("calls="):
            pending = (float(line.split("=")[1].split()[0]), cfn)
    return out


def per(lo, hi, dn):
    a, b = parse(lo), parse(hi)
    return {k: ((b.get(k, [0, 0])[0] - a.get(k, [0, 0])[0]) / dn, (b.get(k, [0, 0])[1] - a.get(k, [0, 0])[1]) / dn)
            for k in set(a) | set(b)}


p1 = per(args[0], args[1], float(args[2]))
p2 = per(args[3], args[4], float(args[5])) if len(args) >= 6 else {}


def short(k):
    f, line, fn = k
    return f"{f}:{line} in {re.sub(r'::h[0-9a-f]{16}$', '', fn or '?')[-90:]}"


# match the two sides on file:line only (function names differ with inlining)
def by_line(p):
    r = defaultdict(lambda: [0.0, 0.0, set()])
    for k, v in p.items():
        kk = (k[0], k[1])
        r[kk][0] += v[0]
        r[kk][1] += v[1]
        r[kk][2].add(short(k).split(" in ", 1)[1])
    return r


q1, q2 = by_line(p1), by_line(p2)
keys = sorted(set(q1) | set(q2), key=lambda k: -max(abs(q1.get(k, [0, 0])[1]), abs(q2.get(k, [0, 0])[1])))
print("A calls  A instr | B calls  B instr | caller line (per command)")
for k in keys:
    a, b = q1.get(k, [0, 0, set()]), q2.get(k, [0, 0, set()])
    if abs(a[0]) < 0.01 and abs(b[0]) < 0.01:
        continue
    print(f"{a[0]:7.2f} {a[1]:8.0f} | {b[0]:7.2f} {b[1]:8.0f} | {k[0]}:{k[1]} ({'; '.join(sorted(a[2] | b[2]))[:100]})")
