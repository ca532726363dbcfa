#!/usr/bin/env python3
"""Per run (`*.ss.txt` or `*.ss.txt.gz` of `scripts/bench mcs-sweep --evidence`), on the side
that sends the data (the initiator's sockets for writes and iperf3, the target's for reads):
each socket's send buffer as the kernel counts it (`ss -m`'s `skmem:(...,tb<bytes>,...)`), as
`MiB x samples` over the run's samples, so a connection sized once it joined shows both values.

Usage, from the repository's root: `python3 docs/results/mcs-sweep-9/sndbuf.py RUN.ss.txt[.gz]...`"""
import collections
import gzip
import os
import re
import sys


def lines(path):
    if path.endswith(".gz"):
        with gzip.open(path, "rt") as f:
            yield from f
    else:
        with open(path) as f:
            yield from f


def main():
    paths = sys.argv[1:]
    if not paths:
        sys.exit(__doc__)
    print("| run | side | sockets | send buffer, MiB x samples |")
    print("|---|---|---:|---|")
    for path in paths:
        run = re.sub(r"\.ss\.txt(\.gz)?$", "", os.path.basename(path))
        side = "tgt" if "-read" in run or "iperf3r" in run else "ini"
        ns = None
        sizes = collections.Counter()
        socks = set()
        for line in lines(path):
            if line.startswith("t="):
                ns = line.split("ns=")[1].strip()
                continue
            if ns != side:
                continue
            m = re.search(r"\btb(\d+)", line)
            if m:
                sizes[int(m.group(1))] += 1
            p = re.search(r"(\d+\.\d+\.\d+\.\d+:\d+)\s+(\d+\.\d+\.\d+\.\d+:\d+)", line)
            if p:
                socks.add(p.groups())
        shown = ", ".join(f"{b / (1 << 20):.2f} x {n}" for b, n in sorted(sizes.items(), key=lambda x: -x[1]))
        print(f"| {run} | {side} | {len(socks)} | {shown} |")


if __name__ == "__main__":
    main()
