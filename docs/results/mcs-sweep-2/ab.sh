#!/bin/sh
# Old (the session's starting binary, --bin-b) against new (this branch, --bin) in the cells
# issue 28 missed, alternated within every cell, with ss samples (README.md), as root:
#   $1 = the new binary (a release build of this branch)
set -e
cd "$(dirname "$0")/../../.."
D=docs/results/mcs-sweep-2
NEW=${1:?new binary}
OLD=/work/notes/bin/ipsan-int2
uptime
# 100 Mbit/s, 0.1 % loss, 4 and 8 connections.
scripts/bench mcs-sweep --bin "$NEW" --bin-b "$OLD" --rates 100mbit --losses 0.1% --conns 4,8 \
    --reps 2 --evidence --out $D/100mbit-loss0.1
uptime
# 1 Gbit/s, clean, 1 and 8 connections.
scripts/bench mcs-sweep --bin "$NEW" --bin-b "$OLD" --rates 1gbit --losses 0 --conns 1,8 \
    --reps 1 --evidence --out $D/1gbit-clean
uptime
# 1 Gbit/s, 1 % loss, 1-connection reads (the old ones lost their connection after ~71 s).
scripts/bench mcs-sweep --bin "$NEW" --bin-b "$OLD" --rates 1gbit --losses 1% --conns 1 \
    --sides iperf3,read --reps 1 --out $D/1gbit-loss1-read
uptime
# One sealed 256 KiB write at a time at 1 Gbit/s, 64 ms: an R2T round trip per write or not.
scripts/bench mcs-sweep --bin "$NEW" --bin-b "$OLD" --rates 1gbit --losses 0 --conns 1 \
    --depth 1 --bs 256KiB --sides write --reps 1 --out $D/1gbit-depth1-write
uptime
