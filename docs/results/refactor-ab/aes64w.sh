#!/bin/bash
# The AES-256-GCM 64 KiB x 1 write cell of run.sh alone, with more reps (15): quiet, with 200 us
# of guest halt polling (put back by the trap), from the repository's root: NEW = the release
# build measured, OLD = 98d9f39. About 3 minutes. boot.py prints the per-rep ratio and its
# bootstrap interval, abtable.py the table.
N=${1:?NEW binary}; O=${2:?OLD binary (98d9f39)}; D=${3:-docs/results/refactor-ab}
P=/sys/module/haltpoll/parameters/guest_halt_poll_ns
trap 'echo 0 > $P' EXIT
echo 200000 > $P
scripts/bench seal --bin $N --bin-b $O --bs 64KiB --depth 1 --size 2GiB --reps 15 --ciphers aes-256-gcm --rw write --out $D/64KiBx1-aes-w
python3 $D/abtable.py $D/64KiBx1-aes-w/raw.jsonl
python3 $D/boot.py $D/64KiBx1-aes-w/raw.jsonl
