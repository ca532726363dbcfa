#!/bin/bash
# Issue 29: Fig. 11 in the papers' regime, quiet (session 23): the calibration, then the 128-run plan,
# then the report and Fig. 11's metric. BIN: the release build measured (main 3c72c408's here).
set -e
B=${1:?release ipsan binary}
D=${2:-/work/scratch-s23/fig11}
P=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$D" && cp "$P/plan.toml" "$D/plan.toml"
echo "start $(date -u +%T) load $(cat /proc/loadavg)" > "$D/times.txt"
timeout 600 "$B" lab calibrate --plan "$D/plan.toml" --out "$D/cal.json" --quiet > "$D/cal.log" 2>&1
echo "cal done $(date -u +%T) load $(cat /proc/loadavg) rc $?" >> "$D/times.txt"
timeout 2400 "$B" lab run --plan "$D/plan.toml" --calibration "$D/cal.json" --out "$D/out" --quiet > "$D/run.log" 2>&1
echo "run done $(date -u +%T) load $(cat /proc/loadavg) rc $?" >> "$D/times.txt"
"$B" lab report "$D/out"
python3 "$P/fig11.py" "$D/out/prediction.csv" > "$D/fig11.csv"
