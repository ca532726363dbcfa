#!/bin/bash
cd /work/main
N=NEW; O=OLD
D=/work/notes/s15/ab3
scripts/bench seal --bin $N --bin-b $O --bs 4KiB --depth 32 --size 1GiB --reps 7 --ciphers plain,aes-256-gcm --out $D/4KiBx32 > $D/4k.log 2>&1
scripts/bench seal --bin $N --bin-b $O --bs 64KiB --depth 1 --size 2GiB --reps 5 --ciphers plain,aes-256-gcm --out $D/64KiBx1 > $D/64k.log 2>&1
scripts/bench seal --bin $N --bin-b $O --bs 1MiB --depth 16 --size 8GiB --reps 5 --ciphers plain,none,aes-256-gcm --out $D/1MiBx16 > $D/1m.log 2>&1
echo done > $D/done
