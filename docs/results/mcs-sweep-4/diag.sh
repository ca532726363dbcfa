#!/bin/sh
# Where reads at 0.1 % loss lose (README.md "Where the reads lose"): main's binary at the start
# of this session (ipsan-s19), 8 connections, reads beside iperf3 with loss each way and with
# loss only on the way from the target (a read's data; its commands cross intact), as root.
set -e
cd "$(dirname "$0")/../../.."
D=docs/results/mcs-sweep-4
uptime
scripts/bench mcs-sweep --bin /work/notes/bin/ipsan-s19 --rates 100mbit --losses 0.1%,down:0.1% \
    --conns 8 --sides iperf3,read --reps 3 --evidence --out $D/diag-loss-way
uptime
# The initiator's receive buffer fixed at 4 MiB against autotuned (its ACKs: README.md).
scripts/bench mcs-sweep --bin /work/notes/bin/ipsan-s19 --bin-b $D/ipsan-s19-rcvbuf4m \
    --rates 100mbit --losses 0.1% --conns 8 --sides iperf3,read --reps 3 --evidence \
    --out $D/diag-rcvbuf
uptime
