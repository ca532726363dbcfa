#!/bin/bash
# depth-1 latency and peers with the guest's halt polling on (guest_halt_poll_ns=200000, the
# haltpoll driver's default) -- this VM ships with 0 (every idle vCPU halts at once)
cd /work/main
B=/work/notes/bin
D=/work/runs/s17
F=/work/main/target/release/examples/floor
P=/sys/module/haltpoll/parameters/guest_halt_poll_ns
trap 'echo 0 > $P' EXIT
echo 200000 > $P
mkdir -p $D/lat-poll
for r in 1 2; do
  echo "$(date +%T) $(cat /proc/loadavg) poll_ns=$(cat $P)" >> $D/lat-poll/load.txt
  $F --iters 10000 --warmup 1000 --json >> $D/lat-poll/floor.jsonl
  docs/results/latency-floor/lat.sh $B/ipsan-wy $D/lat-poll wy$r 3s > $D/lat-poll/wy$r.txt 2>&1
  docs/results/latency-floor/lat.sh $B/ipsan-3378dc6 $D/lat-poll main$r 3s > $D/lat-poll/main$r.txt 2>&1
done
$F --iters 10000 --warmup 1000 --json >> $D/lat-poll/floor.jsonl
scripts/bench peers --secs 5 --reps 3 --size 1GiB --bin $B/ipsan-wy --out $D/peers-wy-poll > $D/peers-wy-poll.log 2>&1
echo done > $D/quiet3.done
