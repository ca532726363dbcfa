#!/usr/bin/env bash
# Old build against new, alternated: nvme-tls's example and `scripts/bench nvme`, with the
# cipher's own speed (openssl speed) at the start and the end of the same run.
#   docs/results/nvme-tls-cost/run.sh OLD_IPSAN NEW_IPSAN OLD_EXAMPLE NEW_EXAMPLE OUT [REPS]
# OUT gets: loadavg.txt, openssl-speed-{start,end}.txt, example-{old,new}-N.txt,
# bench-{old,new}-N/ (scripts/bench nvme's directories); summarize.py OUT makes summary.md.
set -euo pipefail
old_bin=$1 new_bin=$2 old_ex=$3 new_ex=$4 out=$5 reps=${6:-3}
root=$(cd "$(dirname "$0")/../../.." && pwd)
mkdir -p "$out"
load() { echo "$1 $(date -u +%FT%TZ) $(cat /proc/loadavg)" >> "$out/loadavg.txt"; }
load start
openssl speed -evp aes-128-gcm -bytes 16384 -seconds 3 > "$out/openssl-speed-start.txt" 2>&1
for rep in $(seq 1 "$reps"); do
  # The order alternates rep by rep: old first in odd reps, new first in even ones.
  if (( rep % 2 )); then order="old new"; else order="new old"; fi
  for side in $order; do
    if [[ $side == old ]]; then ex=$old_ex bin=$old_bin; else ex=$new_ex bin=$new_bin; fi
    load "example-$side-$rep"
    "$ex" > "$out/example-$side-$rep.txt"
    load "bench-$side-$rep"
    "$root/scripts/bench" nvme --reps 1 --secs 3 --size 256MiB --bin "$bin" \
      --out "$out/bench-$side-$rep" > /dev/null 2>&1
  done
done
openssl speed -evp aes-128-gcm -bytes 16384 -seconds 3 > "$out/openssl-speed-end.txt" 2>&1
load end
