#!/usr/bin/env python3
"""cgfiles.py [--lines] [--top=K] A_LO A_HI DN [B_LO B_HI DN]: callgrind's self instructions per
command by source file (or file:line with --lines), inlined code counted in the file it was
written in (callgrind's fi=/fe= records, from the release build's line tables), (HI - LO) / DN;
with a second pair, A and B side by side, largest differences first. Paths are cut to what
follows crates/, src/ (the workspace) or the registry's crate directory, so two checkouts
compare."""
import gzip
import re
import sys
from collections import defaultdict

args = [a for a in sys.argv[1:] if not a.startswith("--")]
lines = "--lines" in sys.argv
top = 50
for a in sys.argv[1:]:
    if a.startswith("--top="):
        top = int(a.split("=")[1])


def norm(p):
    m = re.search(r"/registry/src/[^/]+/([^/]+)/(.*)", p)
    if m:
        return re.sub(r"-\d+\.\d+\.\d+.*$", "", m.group(1)) + "/" + m.group(2)
    m = re.search(r"/rustc/[0-9a-f]+/(.*)", p)
    if m:
        return "std:" + m.group(1)
    for k in ("/crates/", "/src/"):
        i = p.rfind(k) if k == "/crates/" else -1
        if i >= 0:
            return p[i + 1:]
    m = re.search(r"/(src/.*)", p)
    return m.group(1) if m else p


def parse(f):
    names = {"fl": {}, "fn": {}}
    cost = defaultdict(float)
    fl = fi = None
    last = 0
    skip = False
    for line in (gzip.open(f, "rt", errors="replace") if f.endswith(".gz") else open(f, errors="replace")):
        line = line.rstrip("\n")
        if not line:
            continue
        c = line[0]
        if c.isdigit() or c in "+-*":
            parts = line.split()
            p = parts[0]
            if p == "*":
                pos = last
            elif p[0] in "+-":
                pos = last + int(p)
            else:
                pos = int(p)
            last = pos
            if skip:
                skip = False
                continue
            if len(parts) > 1:
                src = fi or fl or "?"
                key = (src, pos) if lines else src
                cost[key] += float(parts[1])
            continue
        m = re.match(r"(fl|fi|fe|fn|cfi|cfl|cfn|ob|cob)=\((\d+)\)(?: (.*))?$", line)
        if m:
            kind, ident, name = m.groups()
            table = "fl" if kind in ("fl", "fi", "fe", "cfi", "cfl") else ("fn" if kind in ("fn", "cfn") else kind)
            tab = names.setdefault(table, {})
            if name is not None:
                tab[ident] = name
            name = tab.get(ident, "?")
            if kind == "fl":
                fl, fi = norm(name), None
            elif kind in ("fi", "fe"):
                fi = norm(name)
                if fi == fl:
                    fi = None
            elif kind == "fn":
                fi = None
            continue
        if line.startswith("calls="):
            skip = True
    return cost


def per(lo, hi, dn):
    a, b = parse(lo), parse(hi)
    return {k: (b.get(k, 0) - a.get(k, 0)) / dn for k in set(a) | set(b)}


def show(k):
    return f"{k[0]}:{k[1]}" if isinstance(k, tuple) else k


def main():
    p1 = per(args[0], args[1], float(args[2]))
    if len(args) >= 6:
        p2 = per(args[3], args[4], float(args[5]))
        keys = sorted(set(p1) | set(p2), key=lambda k: -abs(p1.get(k, 0) - p2.get(k, 0)))
        print(f"{'A':>9} {'B':>9} {'A-B':>8}  source (self instructions per command, inlined code where written)")
        print(f"{sum(p1.values()):9.0f} {sum(p2.values()):9.0f} {sum(p1.values()) - sum(p2.values()):8.0f}  (sum)")
        for k in keys[:top]:
            print(f"{p1.get(k, 0):9.0f} {p2.get(k, 0):9.0f} {p1.get(k, 0) - p2.get(k, 0):8.0f}  {show(k)[:140]}")
    else:
        print(f"{sum(p1.values()):9.0f}  (sum)")
        for k in sorted(p1, key=lambda k: -p1[k])[:top]:
            print(f"{p1[k]:9.0f}  {show(k)[:140]}")


if __name__ == "__main__":
    main()
