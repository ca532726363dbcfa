#!/bin/bash
# r64.sh BIN OUTDIR BS DEPTH: one ipsan target; iscsi-perf and ipsan bench reads against it, counted by perf stat.
set -e
BIN=$1; D=$2; BS=${3:-64KiB}; DEPTH=${4:-1}
mkdir -p $D
port=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
IQN=iqn.2026-11.org.ipsan:diag
$BIN target --portal 127.0.0.1:$port --iqn $IQN --lun mem:256MiB > $D/target.log 2>&1 &
TP=$!
trap 'kill $TP 2>/dev/null; wait $TP 2>/dev/null' EXIT
for i in $(seq 50); do grep -q "listening on" $D/target.log && break; sleep 0.1; done
URL=iscsi://127.0.0.1:$port/$IQN/0
$BIN bench $URL --rw write --bs 1MiB --depth 8 --size 256MiB --quiet >/dev/null
EV=context-switches,cpu-migrations,task-clock,page-faults,raw_syscalls:sys_enter,syscalls:sys_enter_writev,syscalls:sys_enter_sendmsg,syscalls:sys_enter_sendto,syscalls:sys_enter_write,syscalls:sys_enter_read,syscalls:sys_enter_recvfrom,syscalls:sys_enter_readv,syscalls:sys_enter_recvmsg,syscalls:sys_enter_epoll_wait,syscalls:sys_enter_ppoll,syscalls:sys_enter_poll,syscalls:sys_enter_futex
BLK=$(python3 -c "b='$BS'; print((int(b[:-3])<<10 if b.endswith('KiB') else int(b[:-3])<<20)//512)")
for rep in 1 2; do
  for side in perf ipsan; do
    perf stat -e $EV -p $TP -o $D/stat-target-$side-$rep.txt &
    SP=$!
    sleep 0.3
    if [ $side = perf ]; then
      perf stat -e $EV -o $D/stat-client-$side-$rep.txt timeout -s INT 3 iscsi-perf -m $DEPTH -b $BLK $URL > $D/out-$side-$rep.txt 2>&1 || true
    else
      perf stat -e $EV -o $D/stat-client-$side-$rep.txt $BIN bench $URL --rw read --bs $BS --depth $DEPTH --time 3s --json $D/bench-$rep.json --quiet > $D/out-$side-$rep.txt 2>&1
    fi
    kill -INT $SP; wait $SP || true
    echo "$side rep $rep: $(cat /proc/loadavg)" >> $D/loadavg.txt
  done
done
