#!/bin/sh
# Issue 28, fifth pass (README.md): reads through 4 and 8 sealed connections at 100 Mbit/s,
# 32 ms one way, 0.1 % loss, main (ipsan-s20) against the same binary with twice the commands
# in flight (the wrapper ipsan-s20-depth128), iperf3 -P N alternated rep by rep; as root from
# the repository root.
set -e
cd "$(dirname "$0")/../../.."
D=docs/results/mcs-sweep-5
S20=/work/notes/bin/ipsan-s20
uptime
# 1. The sweep's own 10 s runs, 4 and 8 connections. (Run as is; the shell running this file
#    was stopped after part 1 and parts 2-3 ran by hand, see run.log.)
scripts/bench mcs-sweep --bin $S20 --bin-b $D/ipsan-s20-depth128 --rates 100mbit --losses 0.1% \
    --conns 4,8 --sides iperf3,read --reps 5 --evidence --out $D/depth-10s
uptime
# 2. Reads against iperf3 -R (side iperf3r: the data going a read's way) beside iperf3 (a
#    write's way), 10 s, 4 and 8 connections: is the reads' reference the right one?
scripts/bench mcs-sweep --bin $S20 --rates 100mbit --losses 0.1% --conns 4,8 \
    --sides iperf3,iperf3r,read --reps 5 --evidence --out $D/reverse-10s
uptime
# 3. 4 connections for 30 s, both references and both depths: is the 10 s runs' deficit a
#    slow-start transient?
scripts/bench mcs-sweep --bin $S20 --bin-b $D/ipsan-s20-depth128 --rates 100mbit --losses 0.1% \
    --conns 4 --sides iperf3,iperf3r,read --reps 5 --secs 30 --evidence --out $D/depth-30s
uptime
