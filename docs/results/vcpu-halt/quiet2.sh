#!/bin/bash
cd /work/main
B=/work/notes/bin
D=/work/runs/s17
F=/work/main/target/release/examples/floor
mkdir -p $D/lat
for r in 1 2; do
  uptime >> $D/lat/load.txt
  $F --iters 10000 --warmup 1000 --json >> $D/lat/floor.jsonl
  docs/results/latency-floor/lat.sh $B/ipsan-wy $D/lat wy$r 3s > $D/lat/wy$r.txt 2>&1
  docs/results/latency-floor/lat.sh $B/ipsan-3378dc6 $D/lat main$r 3s > $D/lat/main$r.txt 2>&1
done
scripts/bench peers --secs 5 --reps 3 --size 1GiB --bin $B/ipsan-wy --out $D/peers-wy > $D/peers-wy.log 2>&1
scripts/bench seal --bin $B/ipsan-wy --bin-b $B/ipsan-98d9f39 --bs 4KiB --depth 32 --size 1GiB --reps 7 --ciphers plain,none,aes-256-gcm --out $D/ab4k-wy-vs-98d-2 > $D/ab4k-wy-vs-98d-2.log 2>&1
echo done > $D/quiet2.done
