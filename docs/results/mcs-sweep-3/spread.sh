#!/bin/sh
# Least-queued (the default since 8a5a736/54a8ed0) against least-bytes, the same binary
# (ipsan-s18b) on both sides, alternated in every cell, as root (README.md):
set -e
cd "$(dirname "$0")/../../.."
D=docs/results/mcs-sweep-3
LQ=/work/notes/bin/ipsan-s18b
LB=$PWD/$D/ipsan-s18b-least-bytes
uptime
scripts/bench mcs-sweep --bin "$LQ" --bin-b "$LB" --rates 1gbit --losses 0 --conns 8,4 \
    --sides write,read --reps 2 --out $D/spread-1gbit-clean
uptime
scripts/bench mcs-sweep --bin "$LQ" --bin-b "$LB" --rates 100mbit --losses 0.1% --conns 8,4 \
    --sides write,read --reps 2 --evidence --out $D/spread-100mbit-loss0.1
uptime
