#!/bin/bash
# Issue 27 (PERF27, session 20): `--seal none` writes sent from the caller's buffer (no sealed
# copy) — plain, none and AES-256-GCM at 1 MiB x 16, writes and reads, per side, NEW (this
# branch's release build) against OLD (ipsan-s19 = main's code at the start of the session),
# each with its own target, alternated rep by rep (scripts/bench seal). perside.py (from
# seal-none-cost-2) prints CPU-s/GB per side and each cipher minus plain, paired per rep.
# Run from the repository's root.
set -e
N=${1:-/work/notes/bin/ipsan-perf27-s20}
O=${2:-/work/notes/bin/ipsan-s19}
D=${3:-docs/results/seal-none-cost-3}
REPS=${REPS:-3}
SIZE=${SIZE:-4GiB}
SUB=${SUB:-1MiBx16}
cat /sys/module/haltpoll/parameters/guest_halt_poll_ns > "$D/halt_poll_ns-$SUB.txt" 2>/dev/null || true
scripts/bench seal --bin "$N" --bin-b "$O" --bs 1MiB --depth 16 --size "$SIZE" --reps "$REPS" \
    --ciphers plain,none,aes-256-gcm --rw write,read --out "$D/$SUB"
python3 docs/results/seal-none-cost-2/perside.py "$D/$SUB/raw.jsonl" | tee "$D/$SUB/perside.txt"
