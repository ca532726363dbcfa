#!/bin/sh
# Issue 28, 1 Gbit/s sealed writes: this branch's build (write) beside main 2584ad5 (write-b)
# and iperf3, 32 ms one way, no loss, 1 and 8 connections, with `ss` evidence of both ends.
# As root, from the repository root of the branch's checkout. pace-1gbit-clean/ was run as
# NEW=<paced build> OLD=<pick fix only> PART=pace-1gbit-clean REPS=2 (README.md).
# Each part's own command.txt has the exact command it ran.
set -e
R=docs/results/mcs-sweep-6
NEW=${NEW:-/work/notes/s22/wan28/ipsan-wan28a}   # release build of this branch
OLD=${OLD:-/work/notes/bin/ipsan-s21}            # release build of main 2584ad5
scripts/bench mcs-sweep --bin "$NEW" --bin-b "$OLD" --rates 1gbit --losses 0 --conns 1,8 \
    --reps "${REPS:-2}" --sides write,iperf3 --evidence --out "$R/${PART:-ab-1gbit-clean}"
python3 $R/ss_idle.py $R/${PART:-ab-1gbit-clean}/*-write*.ss.txt \
    $R/${PART:-ab-1gbit-clean}/*-iperf3-*.ss.txt > $R/${PART:-ab-1gbit-clean}/ss-idle.txt
