#!/bin/bash
# prof.sh BIN LABEL PROTO(iscsi|nvme) RW BS DEPTH OUTDIR [SECS] [BENCH FLAGS...]
# One ipsan target (1 GiB mem LUN, filled once) and one `ipsan bench` run of PROTO against it,
# each side counted with perf stat (task-clock, context switches, syscalls) and sampled with
# perf record (no call graphs); perf report's top symbols per side go to OUTDIR.
set -e
BIN=$1; L=$2; P=$3; RW=$4; BS=$5; DEPTH=$6; D=$7; SECS=${8:-4}; shift 8 || shift $#
mkdir -p "$D"
free_port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
port=$(free_port); nport=$(free_port)
IQN=iqn.2026-11.org.ipsan:prof4
N=$L-$P-$RW-$BS-$DEPTH
LOG=$D/target-$N.log
"$BIN" target --portal 127.0.0.1:$port --iqn $IQN --lun mem:1GiB --nvme-listen 127.0.0.1:$nport > "$LOG" 2>&1 &
TP=$!
trap 'kill $TP 2>/dev/null; wait $TP 2>/dev/null' EXIT
for i in $(seq 100); do grep -q "serving nvme+tcp" "$LOG" && break; sleep 0.1; done
ISCSI=iscsi://127.0.0.1:$port/$IQN/0
NVME=$(grep -o 'nvme+tcp://[^ ]*' "$LOG" | head -1)
"$BIN" bench "$ISCSI" --rw write --bs 1MiB --depth 16 --size 1GiB --quiet >/dev/null
if [ "$P" = nvme ]; then URL=$NVME; EXTRA="--queues 2"; else URL=$ISCSI; EXTRA=; fi
EV=context-switches,cpu-migrations,task-clock,raw_syscalls:sys_enter,syscalls:sys_enter_writev,syscalls:sys_enter_sendmsg,syscalls:sys_enter_recvfrom,syscalls:sys_enter_epoll_wait,syscalls:sys_enter_futex,syscalls:sys_enter_write
perf stat -e $EV -p $TP -o "$D/stat-target-$N.txt" &
SP=$!
perf record -F 2999 -p $TP -o "$D/perf-target-$N.data" 2>/dev/null &
RP=$!
sleep 0.3
perf stat -e $EV -o "$D/stat-bench-$N.txt" \
  "$BIN" bench "$URL" $EXTRA "$@" --rw $RW --bs $BS --depth $DEPTH --time ${SECS}s --json "$D/bench-$N.json" --quiet >/dev/null 2>&1 &
BS_PID=$!
sleep 0.5
BP=$(pgrep -P $BS_PID | head -1)
perf record -F 2999 -p $BP -o "$D/perf-bench-$N.data" 2>/dev/null &
BR=$!
wait $BS_PID || true
wait $BR || true
kill -INT $SP $RP; wait $SP $RP || true
cat /proc/loadavg > "$D/loadavg-$N.txt"
for s in target bench; do
  perf report -i "$D/perf-$s-$N.data" --no-children --sort sym --stdio 2>/dev/null | grep -v '^#' | grep -v '^$' | head -45 > "$D/top-$s-$N.txt"
  rm -f "$D/perf-$s-$N.data"
done
