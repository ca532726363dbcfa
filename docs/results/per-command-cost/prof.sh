#!/bin/bash
# prof.sh BIN LABEL RW OUTDIR MODE(stat|record) [BS DEPTH SIZE]
# One ipsan target (1 GiB mem LUN, filled once) and one `ipsan bench` run against it,
# counted (perf stat: context switches, migrations, syscalls, per process) or sampled
# (perf record -g --call-graph dwarf on both processes).
set -e
BIN=$1; L=$2; RW=$3; D=$4; MODE=$5; BS=${6:-4KiB}; DEPTH=${7:-32}; SIZE=${8:-512MiB}
mkdir -p $D
port=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
IQN=iqn.2026-11.org.ipsan:prof
$BIN target --portal 127.0.0.1:$port --iqn $IQN --lun mem:1GiB > $D/target-$L-$RW.log 2>&1 &
TP=$!
trap 'kill $TP 2>/dev/null; wait $TP 2>/dev/null' EXIT
for i in $(seq 50); do grep -q "listening on" $D/target-$L-$RW.log && break; sleep 0.1; done
URL=iscsi://127.0.0.1:$port/$IQN/0
$BIN bench $URL --rw write --bs 1MiB --depth 16 --size 1GiB --quiet >/dev/null
EV=context-switches,cpu-migrations,raw_syscalls:sys_enter,task-clock,syscalls:sys_enter_writev,syscalls:sys_enter_read,syscalls:sys_enter_recvfrom,syscalls:sys_enter_epoll_wait,syscalls:sys_enter_futex
if [ $MODE = stat ]; then
  perf stat -e $EV -p $TP -o $D/stat-target-$L-$RW-$BS.txt &
  SP=$!
  sleep 0.3
  perf stat -e $EV -o $D/stat-bench-$L-$RW-$BS.txt $BIN bench $URL --rw $RW --bs $BS --depth $DEPTH --size $SIZE --threads 2 --json $D/bench-$L-$RW-$BS.json --quiet >/dev/null
  kill -INT $SP; wait $SP || true
else
  perf record -F 2999 --call-graph dwarf,16384 -p $TP -o $D/target-$L-$RW-$BS.data 2>/dev/null &
  SP=$!
  sleep 0.3
  perf record -F 2999 --call-graph dwarf,16384 -o $D/bench-$L-$RW-$BS.data $BIN bench $URL --rw $RW --bs $BS --depth $DEPTH --size $SIZE --threads 2 --json $D/bench-$L-$RW-$BS.json --quiet >/dev/null 2>&1
  kill -INT $SP; wait $SP || true
fi
cat /proc/loadavg > $D/loadavg-$L-$RW-$BS.txt
