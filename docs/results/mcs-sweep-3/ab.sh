#!/bin/sh
# This branch (NEW: its release build: each MC/S connection's minimum RTO 20 ms, least-queued
# only while the sockets' rates are more than twice apart) against the session's starting
# binary (ipsan-s18b, least-queued always) in the cells the spread comparison (spread.sh) and
# the reads left open, alternated in every cell, as root (README.md):
#   $1 = the new binary
set -e
cd "$(dirname "$0")/../../.."
D=docs/results/mcs-sweep-3
NEW=${1:?new binary}
OLD=/work/notes/bin/ipsan-s18b
uptime
scripts/bench mcs-sweep --bin "$NEW" --bin-b "$OLD" --rates 100mbit --losses 0.1% --conns 8,4 \
    --reps 3 --evidence --out $D/ab-100mbit-loss0.1
uptime
scripts/bench mcs-sweep --bin "$NEW" --bin-b "$OLD" --rates 1gbit --losses 0 --conns 8 \
    --sides write,read --reps 2 --out $D/ab-1gbit-clean
uptime
