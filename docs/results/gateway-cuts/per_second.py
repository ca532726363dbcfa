#!/usr/bin/env python3
"""Per-second throughput of the host's run in this directory, with the WAN connection cuts.

Reads host.trace.jsonl.xz (`ipsan bench --trace`, schema ipsan-trace/1: one `completed` event per
64 KiB command) and a.log (gateway A's log: `remote session open` when the host's remote
session was ready, the host's login answered right after; `connection lost; its tasks are
reassigned` when a cut reached A). The trace's clock starts with the host's run, so cut times
are placed on it as (A's cut line - A's `remote session open` line): a few ms late at most.

Usage: python3 per_second.py [DIR]   (prints a table; `--csv` for CSV)
"""
import datetime
import json
import lzma
import statistics
import sys
from pathlib import Path

args = [a for a in sys.argv[1:] if not a.startswith("--")]
d = Path(args[0]) if args else Path(__file__).parent
csv = "--csv" in sys.argv

def stamp(line):
    t = line.split()[0]
    t = t.rstrip("Z")
    return datetime.datetime.fromisoformat(t).timestamp()

opened = None
cuts = []
back = []
for line in (d / "a.log").read_text().splitlines():
    if "remote session open" in line and opened is None:
        opened = stamp(line)
    elif "connection lost; its tasks are reassigned" in line:
        cuts.append(stamp(line))
    elif "connection logged in again" in line:
        back.append(stamp(line))

raw = d / "host.trace.jsonl"
text = raw.read_text() if raw.exists() else lzma.open(d / "host.trace.jsonl.xz", "rt").read()
lines = text.splitlines()
header = json.loads(lines[0])
bs = header.get("block_size", 65536)
done = {}
failed = 0
for l in lines[1:]:
    e = json.loads(l)
    if e["event"] == "completed":
        s = int(e["t_us"] // 1_000_000)
        done[s] = done.get(s, 0) + 1
    elif e["event"] == "failed":
        failed += 1
last = max(done) if done else 0
# A connection that ends as the session logs out after the run is no cut.
cut_s = [c - opened for c in cuts if c - opened < last]
back_s = [b - opened for b in back]
rates = [done.get(s, 0) * bs / 1e6 for s in range(last + 1)]
if csv:
    print("second,mb_per_s,cut_in_this_second")
    for s, r in enumerate(rates):
        print(f"{s},{r:.2f},{int(any(s <= c < s + 1 for c in cut_s))}")
    sys.exit(0)
print(f"host run: {header.get('target')} {header.get('rw')} bs={bs} depth={header.get('depth')}")
print(f"commands failed (trace): {failed}")
print("cuts seen by gateway A at (s on the trace's clock):", ", ".join(f"{c:.2f}" for c in cut_s))
print("connections logged in again at:", ", ".join(f"{b:.2f}" for b in back_s))
full = rates[1:-1]  # the first and last seconds are partial
print(f"per second, MB/s (median {statistics.median(full):.1f}, range "
      f"{min(full):.1f}-{max(full):.1f}, seconds 1..{len(rates) - 2}):")
for s, r in enumerate(rates):
    mark = " <- cut" if any(s <= c < s + 1 for c in cut_s) else ""
    print(f"{s:4d} {r:8.1f}{mark}")
# The dip: the second holding each cut and the one after, against the median of the seconds
# at least 2 s from any cut.
far = [r for s, r in enumerate(rates) if 0 < s < len(rates) - 1
       and all(abs(s + 0.5 - c) >= 2 for c in cut_s)]
base = statistics.median(far) if far else float("nan")
print(f"median of the seconds >= 2 s from a cut: {base:.1f} MB/s")
for c in cut_s:
    s = int(c)
    w = [rates[k] for k in (s, s + 1) if k < len(rates)]
    print(f"cut at {c:.2f} s: seconds {s}-{s + 1}: {', '.join(f'{x:.1f}' for x in w)} MB/s "
          f"({min(w) / base:.2f}x of that median at the lowest)")
