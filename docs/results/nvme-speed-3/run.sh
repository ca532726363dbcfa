#!/bin/bash
# nvme-speed-3: the r-nvspeed release build (NEW) against 25ed9b8 (OLD, /work/notes/bin/ipsan-int2),
# alternated rep by rep in one run, on the machine as it is (shared: other engineers' builds).
#   ab-halting/  NEW vs OLD, guest_halt_poll_ns as the VM ships (0)
#   ab-polling/  the same with 200 us of guest halt polling (set by the script, put back)
#   queues/      NEW only: iSCSI against NVMe/TCP with 1, 2 and 4 I/O queues
#   prof/        per-command context switches and syscalls (perf stat), NEW vs NEW with
#                --sq-flow-control vs OLD (run by hand with these commands, 120 s timeout each)
# Usage: docs/results/nvme-speed-3/run.sh NEW [OLD] [DIR] [PARTS]   (PARTS: ab-halting,ab-polling,queues,prof)
set -e
NEW=${1:?NEW binary}; OLD=${2:-/work/notes/bin/ipsan-int2}; D=${3:-docs/results/nvme-speed-3}
S="$(cd "$(dirname "$0")/../nvme-speed-2" && pwd)"  # its prof.sh and sum.py
PARTS=${4:-ab-halting,ab-polling,queues,prof}
has() { [[ ",$PARTS," == *",$1,"* ]]; }
if has ab-halting; then
  scripts/bench nvme --bin "$NEW" --bin-b "$OLD" --reps 3 --secs 3 --size 1GiB --halt-poll 0 --out "$D/ab-halting"
fi
if has ab-polling; then
  scripts/bench nvme --bin "$NEW" --bin-b "$OLD" --reps 3 --secs 3 --size 1GiB --halt-poll 200000 --out "$D/ab-polling"
fi
if has queues; then
  scripts/bench nvme --bin "$NEW" --queues 1,2,4 --sides iscsi,nvme --reps 3 --secs 3 --size 1GiB --halt-poll 0 --out "$D/queues"
fi
if has prof; then
  for cell in "randread 4KiB 32" "read 1MiB 16"; do
    set -- $cell
    # sqfc: NEW with --sq-flow-control on every NVMe bench (sqfc-wrapper.sh names NEW's path).
    for who in "new $NEW" "sqfc ${SQFC:-/work/tgt-nvspeed/ipsan-nvspeed-sqfc}" "old $OLD"; do
      L=${who%% *}; B=${who#* }
      "$S/prof.sh" "$B" "$L" nvme "$1" "$2" "$3" "$D/prof" 4
    done
    "$S/prof.sh" "$NEW" new iscsi "$1" "$2" "$3" "$D/prof" 4
  done
  python3 "$S/sum.py" "$D/prof" > "$D/prof/summary.txt"
fi
