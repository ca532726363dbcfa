#!/bin/bash
# prof.sh BIN LABEL PROTO(iscsi|nvme) RW BS DEPTH OUTDIR [SECS]
# One ipsan target (1 GiB mem LUN, filled once, iSCSI and NVMe/TCP on loopback) and one
# `ipsan bench` run of PROTO against it, counted per process with perf stat: context
# switches, syscalls (all, and the I/O and wait ones), task-clock. After
# docs/results/per-command-cost/prof.sh (copied from nvme-speed-2); the bench runs as `scripts/bench nvme` runs it
# (one runtime thread; NVMe with 2 I/O queues).
set -e
BIN=$1; L=$2; P=$3; RW=$4; BS=$5; DEPTH=$6; D=$7; SECS=${8:-5}
mkdir -p "$D"
free_port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
port=$(free_port); nport=$(free_port)
IQN=iqn.2026-11.org.ipsan:prof
LOG=$D/target-$L-$P-$RW-$BS.log
"$BIN" target --portal 127.0.0.1:$port --iqn $IQN --lun mem:1GiB --nvme-listen 127.0.0.1:$nport > "$LOG" 2>&1 &
TP=$!
trap 'kill $TP 2>/dev/null; wait $TP 2>/dev/null' EXIT
for i in $(seq 100); do grep -q "serving nvme+tcp" "$LOG" && break; sleep 0.1; done
ISCSI=iscsi://127.0.0.1:$port/$IQN/0
NVME=$(grep -o 'nvme+tcp://[^ ]*' "$LOG" | head -1)
"$BIN" bench "$ISCSI" --rw write --bs 1MiB --depth 16 --size 1GiB --quiet >/dev/null
if [ "$P" = nvme ]; then URL=$NVME; EXTRA="--queues 2"; else URL=$ISCSI; EXTRA=; fi
EV=context-switches,cpu-migrations,task-clock,raw_syscalls:sys_enter,syscalls:sys_enter_write,syscalls:sys_enter_writev,syscalls:sys_enter_sendmsg,syscalls:sys_enter_read,syscalls:sys_enter_recvfrom,syscalls:sys_enter_epoll_wait,syscalls:sys_enter_futex
perf stat -e $EV -p $TP -o "$D/stat-target-$L-$P-$RW-$BS.txt" &
SP=$!
sleep 0.3
perf stat -e $EV -o "$D/stat-bench-$L-$P-$RW-$BS.txt" "$BIN" bench "$URL" $EXTRA --rw $RW --bs $BS --depth $DEPTH --time ${SECS}s --json "$D/bench-$L-$P-$RW-$BS.json" --quiet >/dev/null
kill -INT $SP; wait $SP || true
cat /proc/loadavg > "$D/loadavg-$L-$P-$RW-$BS.txt"
