#!/bin/bash
# Issue 32's A/B, quiet, with 200 us of guest halt polling (put back by the trap), from the
# repository's root: NEW = the release build measured, OLD = 98d9f39. abtable.py prints the
# tables, boot.py the per-rep ratios with bootstrap intervals.
N=${1:?NEW binary}; O=${2:?OLD binary (98d9f39)}; D=${3:-docs/results/refactor-ab}
P=/sys/module/haltpoll/parameters/guest_halt_poll_ns
trap 'echo 0 > $P' EXIT
echo 200000 > $P
scripts/bench seal --bin $N --bin-b $O --bs 64KiB --depth 1 --size 2GiB --reps 31 --ciphers plain,none --out $D/64KiBx1
scripts/bench seal --bin $N --bin-b $O --bs 64KiB --depth 1 --size 2GiB --reps 7 --ciphers aes-256-gcm --out $D/64KiBx1-aes
scripts/bench seal --bin $N --bin-b $O --bs 4KiB --depth 32 --size 1GiB --reps 3 --ciphers plain,none,aes-256-gcm --out $D/4KiBx32
scripts/bench seal --bin $N --bin-b $O --bs 1MiB --depth 16 --size 8GiB --reps 3 --ciphers plain,none,aes-256-gcm --out $D/1MiBx16
for c in 4KiBx32 64KiBx1 64KiBx1-aes 1MiBx16; do python3 $D/abtable.py $D/$c/raw.jsonl; done
python3 $D/boot.py $D/64KiBx1/raw.jsonl
