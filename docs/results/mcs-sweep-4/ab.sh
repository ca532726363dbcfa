#!/bin/sh
# This branch (NEW: its release build: tail probes on the connections of a session of several)
# against main at this session's start (ipsan-s19), alternated in every cell with iperf3, as
# root (README.md); then NEW with its tail probe off (the wrapper ipsan-wan28b-no-probe) as the
# second build, reads only:
#   $1 = the new binary
set -e
cd "$(dirname "$0")/../../.."
D=docs/results/mcs-sweep-4
NEW=${1:?new binary}
OLD=/work/notes/bin/ipsan-s19
uptime
scripts/bench mcs-sweep --bin "$NEW" --bin-b "$OLD" --rates 100mbit --losses 0.1% --conns 8,4 \
    --reps 3 --evidence --out $D/ab-100mbit-loss0.1
uptime
scripts/bench mcs-sweep --bin "$NEW" --bin-b $D/ipsan-wan28b-no-probe --rates 100mbit \
    --losses 0.1% --conns 8 --sides iperf3,read --reps 3 --out $D/probe-on-off
uptime
# The same binary with TCP_QUICKACK after every write on the initiator's sockets (README.md
# "ACKs"), reads and writes.
scripts/bench mcs-sweep --bin "$NEW" --bin-b $D/ipsan-wan28b-quickack --rates 100mbit \
    --losses 0.1% --conns 8 --reps 3 --evidence --out $D/quickack
uptime
# Afterwards: the branch's default on this kernel (the probe off: the wrapper) against OLD.
scripts/bench mcs-sweep --bin $D/ipsan-wan28b-no-probe --bin-b "$OLD" --rates 100mbit \
    --losses 0.1% --conns 8,4 --reps 3 --out $D/final-vs-s19
uptime
# More reps of the one cell that leaned against the branch (8-connection reads).
scripts/bench mcs-sweep --bin $D/ipsan-wan28b-no-probe --bin-b "$OLD" --rates 100mbit \
    --losses 0.1% --conns 8 --sides iperf3,read --reps 4 --out $D/final-vs-s19-reads
uptime
# The same with the two sides swapped (is being --bin or --bin-b worth anything?).
scripts/bench mcs-sweep --bin "$OLD" --bin-b $D/ipsan-wan28b-no-probe --rates 100mbit \
    --losses 0.1% --conns 8 --sides iperf3,read --reps 4 --out $D/s19-vs-final-reads
uptime
