#!/bin/bash
# count.sh OUTDIR SECS CELL BIN... — per-command counts of one cell (rw/bs/depth, e.g.
# read/64KiB/1), iSCSI and NVMe/TCP (2 I/O queues) alternated, for each binary in turn, REPS
# rounds (default 2).
# SIDES (default "iscsi nvme"): also nvme-t1 (NVMe/TCP with --threads 1) and nvme-q1 (one I/O
# queue). From docs/results/nvme-speed-6/count.sh, with nvme-q1 and IQN changed.
# One `ipsan target` per binary (1 GiB mem LUN, filled once); each `ipsan bench` run is
# counted with perf stat on the bench and on the target (task-clock, context switches,
# migrations, wake-ups each side makes, system calls); system-wide idle entries and
# reschedule IPIs beside it (those count every process on the machine: under load, others').
# Writes OUTDIR/counts.jsonl (one line per run) and the perf stat files.
set -e
D=$1; SECS=$2; CELL=$3; shift 3
RW=${CELL%%/*}; R=${CELL#*/}; BS=${R%%/*}; DEPTH=${R#*/}
mkdir -p "$D"
free_port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
IQN=iqn.2026-11.org.ipsan:count8
SIDES=${SIDES:-iscsi nvme}
EV=task-clock,context-switches,cpu-migrations,sched:sched_wakeup,raw_syscalls:sys_enter,syscalls:sys_enter_writev,syscalls:sys_enter_sendmsg,syscalls:sys_enter_sendto,syscalls:sys_enter_recvfrom,syscalls:sys_enter_read,syscalls:sys_enter_epoll_wait,syscalls:sys_enter_futex,syscalls:sys_enter_write
SYS=power:cpu_idle,irq_vectors:reschedule_entry,irq_vectors:call_function_single_entry
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill $p 2>/dev/null; wait $p 2>/dev/null; done' EXIT
declare -A ISCSI NVME TP
for BIN in "$@"; do
  L=$(basename "$BIN")
  port=$(free_port); nport=$(free_port)
  LOG=$D/target-$L.log
  "$BIN" target --portal 127.0.0.1:$port --iqn $IQN --lun mem:1GiB --nvme-listen 127.0.0.1:$nport > "$LOG" 2>&1 &
  TP[$L]=$!; PIDS+=($!)
  for i in $(seq 100); do grep -q "serving nvme+tcp" "$LOG" && break; sleep 0.1; done
  ISCSI[$L]=iscsi://127.0.0.1:$port/$IQN/0
  NVME[$L]=$(grep -o 'nvme+tcp://[^ ]*' "$LOG" | head -1)
  "$BIN" bench "${ISCSI[$L]}" --rw write --bs 1MiB --depth 16 --size 1GiB --quiet >/dev/null
done
n=0
for rep in $(seq ${REPS:-2}); do
  for BIN in "$@"; do
    L=$(basename "$BIN")
    for P in $SIDES; do
      n=$((n+1))
      N=$(printf %02d $n)-$L-$P
      case $P in
        nvme) URL=${NVME[$L]}; EXTRA="--queues 2";;
        nvme-t1) URL=${NVME[$L]}; EXTRA="--queues 2 --threads 1";;
        nvme-q1) URL=${NVME[$L]}; EXTRA="--queues 1";;
        *) URL=${ISCSI[$L]}; EXTRA=;;
      esac
      perf stat -x, -e $EV -p ${TP[$L]} -o "$D/stat-target-$N.txt" & SP=$!
      perf stat -x, -a -e $SYS -o "$D/stat-system-$N.txt" & AP=$!
      sleep 0.2
      perf stat -x, -e $EV -o "$D/stat-bench-$N.txt" \
        "$BIN" bench "$URL" $EXTRA --rw $RW --bs $BS --depth $DEPTH --time ${SECS}s --json "$D/bench-$N.json" --quiet >/dev/null
      kill -INT $SP $AP; wait $SP $AP || true
      python3 - "$D" "$N" "$L" "$P" "$CELL" <<'PY' >> "$D/counts.jsonl"
import json, sys
d, n, label, proto, cell = sys.argv[1:]
r = json.load(open(f"{d}/bench-{n}.json"))["result"]
def stat(side):
    out = {}
    for line in open(f"{d}/stat-{side}-{n}.txt"):
        f = line.strip().split(",")
        if len(f) < 3 or line.startswith("#"):
            continue
        try:
            out[f[2].split(":")[-1]] = float(f[0])
        except ValueError:
            pass
    return out
ops = r["ops"]
row = {"run": n, "bin": label, "proto": proto, "cell": cell, "ops": ops,
       "mib_s": round(r["throughput_mib_s"], 1), "loadavg": open("/proc/loadavg").read().split()[:3]}
for side in ("bench", "target", "system"):
    row[side] = {k: round(v / ops, 3) for k, v in stat(side).items()}
print(json.dumps(row))
PY
    done
  done
done
