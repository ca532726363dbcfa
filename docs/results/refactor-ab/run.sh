#!/bin/bash
# issue 32's A/B: NEW = main with the writer-yield commit (9fb39c1), OLD = 98d9f39; release
# builds; the 4 KiB cell twice (the second run with `none` too). abtable.py prints the tables.
cd /work/main
N=/work/notes/bin/ipsan-wy; O=/work/notes/bin/ipsan-98d9f39; D=docs/results/refactor-ab
scripts/bench seal --bin $N --bin-b $O --bs 4KiB --depth 32 --size 1GiB --reps 7 --ciphers plain,aes-256-gcm --out $D/4KiBx32-run1
scripts/bench seal --bin $N --bin-b $O --bs 4KiB --depth 32 --size 1GiB --reps 7 --ciphers plain,none,aes-256-gcm --out $D/4KiBx32-run2
scripts/bench seal --bin $N --bin-b $O --bs 64KiB --depth 1 --size 2GiB --reps 5 --ciphers plain,none,aes-256-gcm --out $D/64KiBx1
scripts/bench seal --bin $N --bin-b $O --bs 1MiB --depth 16 --size 8GiB --reps 5 --ciphers plain,none,aes-256-gcm --out $D/1MiBx16
python3 $D/abtable.py $D/4KiBx32-run1/raw.jsonl $D/4KiBx32-run2/raw.jsonl
python3 $D/abtable.py $D/64KiBx1/raw.jsonl
python3 $D/abtable.py $D/1MiBx16/raw.jsonl
