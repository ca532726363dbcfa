#!/bin/bash
# run.sh OLD NEW [STEPS] — per-command counts for issue 27's write cells, `qemu-img bench`
# (libiscsi) against `ipsan target` (../per-command-cost-4/counts.sh, CLIENT=qemu).
# STEPS (comma list, default cg,perf):
#   cg:   callgrind on the target, 1 MiB × 16 writes, N = 100 → 300 (cg-1m/)
#   perf: perf stat on both sides, 1 MiB × 16 (1000 → 3000) and 4 KiB × 32 (20000 → 60000)
#         writes (perf-1MiB/, perf-4KiB/), OLD then NEW
set -e
OLD=$1; NEW=$2; STEPS=${3:-cg,perf}
H=$(cd "$(dirname "$0")" && pwd)
C=$H/../per-command-cost-4/counts.sh
export CLIENT=qemu
if [[ ,$STEPS, == *,cg,* ]]; then
  MODES=cg-target $C "$OLD" old "$H/cg-1m" write 1MiB 16 100 300
  MODES=cg-target $C "$NEW" new "$H/cg-1m" write 1MiB 16 100 300
fi
if [[ ,$STEPS, == *,perf,* ]]; then
  for cell in "1MiB 16 1000 3000" "4KiB 32 20000 60000"; do
    set -- $cell
    MODES=perf $C "$OLD" old "$H/perf-$1" write $1 $2 $3 $4
    MODES=perf $C "$NEW" new "$H/perf-$1" write $1 $2 $3 $4
  done
fi
