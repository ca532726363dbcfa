#!/bin/bash
# Issue 27 (PERF27): `--seal none` and AES-256-GCM against plain at 1 MiB x 16, per side,
# NEW (this branch's release build) against OLD (ipsan-int2 = 25ed9b8, main's code at the
# start of the session), each with its own target, alternated rep by rep (scripts/bench seal).
# perside.py prints CPU-s/GB per side and each cipher minus plain, paired per rep.
N=${1:-$CARGO_TARGET_DIR/release/ipsan}
O=${2:-/work/notes/bin/ipsan-int2}
D=${3:-docs/results/seal-none-cost-2}
REPS=${REPS:-3}
SIZE=${SIZE:-2GiB}
scripts/bench seal --bin "$N" --bin-b "$O" --bs 1MiB --depth 16 --size "$SIZE" --reps "$REPS" \
    --ciphers plain,none,aes-256-gcm --out "$D/1MiBx16"
python3 "$D/perside.py" "$D/1MiBx16/raw.jsonl"
