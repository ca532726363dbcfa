#!/bin/bash
cd /work/notes/s18/lab-write
B=/work/notes/bin/ipsan-int2
echo "start $(date -u +%T) load $(cat /proc/loadavg)" > times.txt
$B lab calibrate --plan plan.toml --out cal.json --quiet > cal.log 2>&1
echo "cal done $(date -u +%T) load $(cat /proc/loadavg) rc $?" >> times.txt
$B lab run --plan plan.toml --calibration cal.json --out out --quiet > run.log 2>&1
echo "run done $(date -u +%T) load $(cat /proc/loadavg) rc $?" >> times.txt
