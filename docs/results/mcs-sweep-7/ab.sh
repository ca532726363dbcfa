#!/bin/sh
# Issue 28, one and two sealed connections at 1 Gbit/s, 32 ms one way, no loss: this branch's
# build (write/read) beside main's (write-b/read-b) and iperf3 -P N, alternated in every cell,
# with `ss` evidence of both ends; then the per-run flight table (flight.py).
# As root, from the repository root of the branch's checkout. ab-1gbit-clean/ was run with
# NEW=/work/notes/s23/wan28/ipsan-wan28-pace (the fix as committed); lowat-1gbit-clean/ with
# NEW=/work/notes/s23/wan28/ipsan-wan28 (the fix plus TCP_NOTSENT_LOWAT, not kept) and
# PART=ab-1gbit-clean, renamed after; the 100 Mbit/s, 1 % loss check with the fix as
# RATE=100mbit LOSS=1% CONNS=1 PART=ab-100mbit-loss1 (README.md).
# Each part's own command.txt has the exact command it ran.
set -e
R=docs/results/mcs-sweep-7
NEW=${NEW:-/work/notes/s23/wan28/ipsan-wan28-pace}   # release build of this branch
OLD=${OLD:-/work/notes/bin/ipsan-s22}           # release build of session 22's main (c7e7f46a)
P=$R/${PART:-ab-1gbit-clean}
scripts/bench mcs-sweep --bin "$NEW" --bin-b "$OLD" --rates "${RATE:-1gbit}" \
    --losses "${LOSS:-0}" --conns "${CONNS:-1,2}" --reps "${REPS:-2}" \
    --sides write,read,iperf3 --evidence --out "$P"
python3 $R/flight.py "$P"/*.ss.txt > "$P/flight.md"
gzip -9 "$P"/*.ss.txt
