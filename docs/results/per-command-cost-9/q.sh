#!/bin/bash
# Final quiet window: q.sh BIN OUT
set -u
BIN=$1; D=$2; mkdir -p $D
cd /work/main
HALT=/sys/module/haltpoll/parameters/guest_halt_poll_ns
echo "start $(date -u +%FT%TZ) load $(cat /proc/loadavg) bin $(sha256sum $BIN | cut -c1-12)" > $D/q.log
docs/results/nvme-vs-iscsi/run.sh $BIN $D/nvme >> $D/q.log 2>&1
echo "nvme done $(date -u +%T) load $(cat /proc/loadavg)" >> $D/q.log
old=$(cat $HALT); echo 200000 > $HALT
for r in 1 2 3; do
  /work/tgt-lead/release/examples/floor --json >> $D/floor-read.jsonl 2>>$D/q.log
  /work/tgt-lead/release/examples/floor --req 65584 --resp 48 --json >> $D/floor-write.jsonl 2>>$D/q.log
done
scripts/bench peers --bin $BIN --reps 3 --secs 5 --size 1GiB --cells read/64KiB/1,write/64KiB/1 --out $D/peers64 >> $D/q.log 2>&1
for r in 1 2 3; do
  /work/tgt-lead/release/examples/floor --json >> $D/floor-read.jsonl 2>>$D/q.log
  /work/tgt-lead/release/examples/floor --req 65584 --resp 48 --json >> $D/floor-write.jsonl 2>>$D/q.log
done
echo $old > $HALT
scripts/bench nvme --bin $BIN --bin-b /work/notes/bin/ipsan-s25 --cells randwrite/4KiB/32,randread/4KiB/32 --sides iscsi,nvme --reps 6 --secs 2 --size 1GiB --halt-poll 200000 --out $D/ab4k-polling >> $D/q.log 2>&1
echo "end $(date -u +%FT%TZ) load $(cat /proc/loadavg)" >> $D/q.log
