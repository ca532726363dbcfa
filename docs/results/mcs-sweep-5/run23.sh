#!/bin/sh
while kill -0 4539 2>/dev/null; do sleep 2; done
cd /work/wt-wan28
D=docs/results/mcs-sweep-5
S20=/work/notes/bin/ipsan-s20
uptime
scripts/bench mcs-sweep --bin $S20 --rates 100mbit --losses 0.1% --conns 4,8 \
    --sides iperf3,iperf3r,read --reps 5 --evidence --out $D/reverse-10s
uptime
scripts/bench mcs-sweep --bin $S20 --bin-b $D/ipsan-s20-depth128 --rates 100mbit --losses 0.1% \
    --conns 4 --sides iperf3,iperf3r,read --reps 5 --secs 30 --evidence --out $D/depth-30s
uptime
