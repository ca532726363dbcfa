#!/usr/bin/env python3
"""Per rep of `scripts/bench mcs-sweep --bin NEW --bin-b OLD` runs (their `raw.jsonl`): the wire
MB/s past slow start (`steady_wire_mb_s`) of each side and the ratios new ÷ old and each ÷
`iperf3 -P N` of the same rep, with the 1-minute load before the new build's run.

Usage: `python3 docs/results/mcs-sweep-9/reps.py DIR...` (a run's directory, as the sweep's `--out`)."""
import json
import os
import sys


def main():
    dirs = sys.argv[1:]
    if not dirs:
        sys.exit(__doc__)
    print("| run | rate | loss | N | rep | iperf3 | write new / old | new ÷ old | new ÷ iperf3 | old ÷ iperf3 "
          "| read new / old | new ÷ old | new ÷ iperf3 | old ÷ iperf3 | load |")
    print("|---|---|---|---:|---:|---:|---|---:|---:|---:|---|---:|---:|---:|---|")
    for d in dirs:
        rows = [json.loads(x) for x in open(os.path.join(d, "raw.jsonl"))]
        cells = {}
        for r in rows:
            cells.setdefault((r["rate"], r["loss"], r["n"], r["rep"]), {})[r["side"]] = r
        for (rate, loss, n, rep), c in sorted(cells.items(), key=lambda x: (x[0][2], x[0][3])):
            def v(side):
                return c.get(side, {}).get("steady_wire_mb_s")

            i = v("iperf3")
            out = [os.path.basename(os.path.normpath(d)), rate, loss, str(n), str(rep),
                   f"{i:.2f}" if i else "–"]
            for rw in ("write", "read"):
                a, b = v(rw), v(f"{rw}-b")
                out.append(f"{a:.2f} / {b:.2f}" if a and b else "–")
                out.append(f"{a / b:.2f}" if a and b else "–")
                out.append(f"{a / i:.2f}" if a and i else "–")
                out.append(f"{b / i:.2f}" if b and i else "–")
            out.append(c.get("write", {}).get("loadavg_before", "").split(" ")[0])
            print("| " + " | ".join(out) + " |")


if __name__ == "__main__":
    main()
