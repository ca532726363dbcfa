#!/bin/bash
# peers-ab.sh NEW OLD OUT [REPS] [CELLS] [SECS]: `scripts/bench peers` once per binary per rep,
# NEW and OLD alternated rep by rep (benchlib's order), each run with its own ipsan target and
# tgtd; then peers-sum.py OUT prints the medians per binary and cell.
set -e
NEW=$1; OLD=$2; OUT=$3; REPS=${4:-3}
CELLS=${5:-write/4KiB/32,read/4KiB/32,write/64KiB/1,read/64KiB/1,write/1MiB/16,read/1MiB/16}
SECS=${6:-4}
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
mkdir -p "$OUT"
echo "halt poll ns: $(cat /sys/module/haltpoll/parameters/guest_halt_poll_ns 2>/dev/null)" >> "$OUT/loadavg.txt"
for rep in $(seq "$REPS"); do
  for side in $(python3 "$ROOT/scripts/bench.d/benchlib.py" order "$rep" new old); do
    if [ "$side" = new ]; then bin=$NEW; else bin=$OLD; fi
    echo "rep $rep $side start: $(cat /proc/loadavg)" >> "$OUT/loadavg.txt"
    "$ROOT/scripts/bench" peers --bin "$bin" --reps 1 --secs "$SECS" --size 1GiB \
      --cells "$CELLS" --out "$OUT/$side-$rep" > "$OUT/$side-$rep.log" 2>&1
    echo "rep $rep $side end: $(cat /proc/loadavg)" >> "$OUT/loadavg.txt"
  done
done
python3 "$(dirname "$0")/peers-sum.py" "$OUT" | tee "$OUT/summary.md"
