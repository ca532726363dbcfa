#!/bin/bash
# final quiet runs: NVMe vs iSCSI (poll 0 and 200 us), issue 32's A/B with polling
cd /work/main
B=/work/notes/bin
N=$B/ipsan-int2
D=/work/runs/s17/final
P=/sys/module/haltpoll/parameters/guest_halt_poll_ns
mkdir -p $D
trap 'echo 0 > $P' EXIT
echo 0 > $P
echo "$(date +%T) $(cat /proc/loadavg) poll=$(cat $P)" >> $D/log.txt
scripts/bench nvme --bin $N --reps 3 --secs 3 --size 1GiB --out $D/nvme-poll0 > $D/nvme-poll0.log 2>&1
echo 200000 > $P
echo "$(date +%T) $(cat /proc/loadavg) poll=$(cat $P)" >> $D/log.txt
scripts/bench nvme --bin $N --reps 3 --secs 3 --size 1GiB --out $D/nvme-poll200us > $D/nvme-poll200us.log 2>&1
echo "$(date +%T) $(cat /proc/loadavg) poll=$(cat $P)" >> $D/log.txt
scripts/bench seal --bin $N --bin-b $B/ipsan-98d9f39 --bs 64KiB --depth 1 --size 2GiB --reps 7 --ciphers plain,none,aes-256-gcm --out $D/ab64k > $D/ab64k.log 2>&1
scripts/bench seal --bin $N --bin-b $B/ipsan-98d9f39 --bs 1MiB --depth 16 --size 8GiB --reps 5 --ciphers plain,none,aes-256-gcm --out $D/ab1m > $D/ab1m.log 2>&1
scripts/bench seal --bin $N --bin-b $B/ipsan-98d9f39 --bs 4KiB --depth 32 --size 1GiB --reps 5 --ciphers plain,none,aes-256-gcm --out $D/ab4k > $D/ab4k.log 2>&1
echo "$(date +%T) $(cat /proc/loadavg) poll=$(cat $P)" >> $D/log.txt
echo done > $D/done
