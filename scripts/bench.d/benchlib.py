"""What every scripts/bench kind shares: its options (from scripts/bench's one parser), the
alternation of compared sides, and medians with their range.

Python kinds: `import benchlib` (scripts/bench puts this directory on PYTHONPATH).
Bash kinds: `python3 scripts/bench.d/benchlib.py median 3 1 2` prints `2`;
`python3 scripts/bench.d/benchlib.py order REP A B` prints the sides in REP's order.
"""

import json
import os
import statistics
import sys
import types


def options():
    """The options scripts/bench parsed for this kind (defaults filled in), as attributes."""
    raw = os.environ.get("IPSAN_BENCH_OPTS")
    if raw is None:
        sys.exit(f"{os.path.basename(sys.argv[0])}: run it as scripts/bench KIND (scripts/bench --list)")
    return types.SimpleNamespace(**json.loads(raw))


def order(rep, sides):
    """The sides of a comparison in rep's order: as given on odd reps, reversed on even ones,
    so a load change hits every side alike over the reps (reps count from 1)."""
    sides = list(sides)
    return sides if rep % 2 == 1 else sides[::-1]


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def spread(xs, fmt="{:.0f}"):
    """`median (min–max)` of xs, or `–` without values."""
    xs = [x for x in xs if x is not None]
    if not xs:
        return "–"
    m = statistics.median(xs)
    return f"{fmt.format(m)} ({fmt.format(min(xs))}–{fmt.format(max(xs))})"


if __name__ == "__main__":
    cmd, *args = sys.argv[1:] or ["help"]
    if cmd == "median":
        print(median([float(x) for x in args]))
    elif cmd == "order":
        print(" ".join(order(int(args[0]), args[1:])))
    else:
        sys.exit(__doc__)
