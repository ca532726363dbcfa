#!/bin/bash
# cg.sh OUTDIR CELL N1 N2 BIN... — instructions per command (callgrind) of one cell
# (rw/bs/depth, e.g. read/1MiB/16) on each side, iSCSI and NVMe/TCP (SIDES, as count.sh: also
# nvme-q1, one I/O queue; from docs/results/nvme-speed-6/cg.sh), for
# each binary: N1 and N2 commands (`--size N × bs`), so (I(N2) − I(N1)) / (N2 − N1) is one
# command's cost without start-up, login and logout.
#   bench side: `ipsan bench` under valgrind --tool=callgrind against a native target (1 GiB
#     RAM LUN, the region written once first);
#   target side: a fresh `ipsan target` under callgrind per run (SIGTERM ends it and callgrind
#     writes its totals), the region written once first (counted alike at N1 and N2), the
#     bench native.
# MODES (default "bench,target") picks the sides.
# Writes OUTDIR/cg.jsonl (one line per binary, side, protocol) and the callgrind files.
# Valgrind runs a program's threads one at a time: instructions count, times do not.
set -e
D=$1; CELL=$2; N1=$3; N2=$4; shift 4
RW=${CELL%%/*}; R=${CELL#*/}; BS=${R%%/*}; DEPTH=${R#*/}
SIDES=${SIDES:-iscsi nvme}
MODES=${MODES:-bench,target}
mkdir -p "$D"
bs_bytes=$(python3 -c "import sys;s=sys.argv[1];u={'KiB':1024,'MiB':1<<20};print(int(s[:-3])*u[s[-3:]])" "$BS")
fill=$(( (N2 * bs_bytes + (1 << 20) - 1) >> 20 << 20 ))
free_port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
IQN=iqn.2026-11.org.ipsan:cg8
TP=
trap '[ -n "$TP" ] && kill $TP 2>/dev/null; true' EXIT
start_target() { # $1 log, $2.. prefix (valgrind …)
  local log=$1; shift
  port=$(free_port); nport=$(free_port)
  "$@" "$BIN" target --portal 127.0.0.1:$port --iqn $IQN --lun mem:1GiB --nvme-listen 127.0.0.1:$nport > "$log" 2>&1 &
  TP=$!
  for i in $(seq 600); do grep -q "serving nvme+tcp" "$log" && break; sleep 0.1; done
  ISCSI=iscsi://127.0.0.1:$port/$IQN/0
  NVME=$(grep -o 'nvme+tcp://[^ ]*' "$log" | head -1)
  "$BIN" bench "$ISCSI" --rw write --bs 1MiB --depth 16 --size $fill --quiet >/dev/null
}
stop_target() { kill -TERM $TP 2>/dev/null; wait $TP 2>/dev/null || true; TP=; }
url() { case $1 in iscsi) echo "$ISCSI";; *) echo "$NVME";; esac; }
extra() { case $1 in nvme) echo "--queues 2";; nvme-t1) echo "--queues 2 --threads 1";; nvme-q1) echo "--queues 1";; esac; }
total() { grep -E '^(summary|totals):' "$1" | head -1 | awk '{print $2}'; }
for BIN in "$@"; do
  L=$(basename "$BIN")
  if [[ ,$MODES, == *,bench,* ]]; then
  start_target "$D/target-$L-native.log"
  for P in $SIDES; do
    for n in $N1 $N2; do
      valgrind --tool=callgrind --callgrind-out-file="$D/cg-bench-$L-$P-$n.out" \
        "$BIN" bench "$(url $P)" $(extra $P) --rw $RW --bs $BS --depth $DEPTH --size $((n * bs_bytes)) --quiet >/dev/null 2>>"$D/valgrind-$L.log"
    done
    python3 -c "import json,sys;a,b=int(sys.argv[4]),int(sys.argv[5]);print(json.dumps({'bin':sys.argv[1],'side':'bench','proto':sys.argv[2],'cell':sys.argv[3],'n1':a,'n2':b,'instr_per_cmd':round((int(sys.argv[7])-int(sys.argv[6]))/(b-a))}))" \
      "$L" "$P" "$CELL" $N1 $N2 "$(total "$D/cg-bench-$L-$P-$N1.out")" "$(total "$D/cg-bench-$L-$P-$N2.out")" >> "$D/cg.jsonl"
  done
  stop_target
  fi
  [[ ,$MODES, == *,target,* ]] || continue
  for P in $SIDES; do
    for n in $N1 $N2; do
      start_target "$D/target-$L-$P-$n.log" valgrind --tool=callgrind --callgrind-out-file="$D/cg-target-$L-$P-$n.out"
      "$BIN" bench "$(url $P)" $(extra $P) --rw $RW --bs $BS --depth $DEPTH --size $((n * bs_bytes)) --quiet >/dev/null
      stop_target
    done
    python3 -c "import json,sys;a,b=int(sys.argv[4]),int(sys.argv[5]);print(json.dumps({'bin':sys.argv[1],'side':'target','proto':sys.argv[2],'cell':sys.argv[3],'n1':a,'n2':b,'instr_per_cmd':round((int(sys.argv[7])-int(sys.argv[6]))/(b-a))}))" \
      "$L" "$P" "$CELL" $N1 $N2 "$(total "$D/cg-target-$L-$P-$N1.out")" "$(total "$D/cg-target-$L-$P-$N2.out")" >> "$D/cg.jsonl"
  done
done
cat /proc/loadavg > "$D/loadavg.txt"
