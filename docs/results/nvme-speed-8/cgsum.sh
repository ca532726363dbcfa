#!/bin/bash
# cgsum.sh DIR N1 N2 — per command (callgrind, (I(N2) − I(N1)) / (N2 − N1)) for every
# cg-SIDE-BIN-PROTO pair in DIR: all instructions, memset, memmove, and the rest ("code":
# memset is the allocator zeroing reused pages, which varies between processes of one binary,
# docs/results/refactor-ab/w64-counts; memmove holds the data copies, per byte).
D=$1; N1=$2; N2=$3
H=$(dirname "$0")/../refactor-ab/w64-counts
printf '%-28s %9s %9s %9s %9s\n' run all memset memmove code
for lo in "$D"/cg-*-"$N1".out*; do
  hi=${lo/-$N1.out/-$N2.out}
  name=$(basename "$lo"); name=${name%-$N1.out*}
  python3 "$H/cgfiles.py" --top=100000 "$lo" "$hi" $((N2 - N1)) | awk -v n="$name" '
    /\(sum\)/ {all=$1} /memset/ {ms+=$1} /memmove/ {mm+=$1}
    END {printf "%-28s %9d %9d %9d %9d\n", n, all, ms, mm, all-ms-mm}'
done
