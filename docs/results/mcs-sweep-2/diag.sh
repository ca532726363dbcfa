#!/bin/sh
# The diagnosis runs (README.md "Diagnosis"), with the session's starting binary only, as root:
# 1. 1 Gbit/s clean, writes through 1 and 8 connections: the old initiator as it is against the
#    same binary offering FirstBurstLength 16776192 (ipsan-int2-first-burst-16m), with ss.
# 2. 100 Mbit/s, 0.1 % loss, 8 connections, writes beside iperf3 -P 8, with ss samples of
#    every connection (mcs_ss_summary.py reads them).
set -e
cd "$(dirname "$0")/../../.."
D=docs/results/mcs-sweep-2
uptime
scripts/bench mcs-sweep --bin /work/notes/bin/ipsan-int2 --bin-b $D/ipsan-int2-first-burst-16m \
    --rates 1gbit --losses 0 --conns 1,8 --sides write --reps 2 --evidence --out $D/diag-1gbit-first-burst
uptime
scripts/bench mcs-sweep --bin /work/notes/bin/ipsan-int2 --rates 100mbit --losses 0.1% --conns 8 \
    --sides iperf3,write --reps 2 --evidence --out $D/diag-100mbit-loss
uptime
