#!/bin/bash
# clients-ab.sh NEW OLD OUTDIR [BS DEPTH SECS REPS]: one target (OLD's, mem: LUN); three clients
# of it in turn, their order rotating rep by rep: `ipsan bench --rw read` of NEW, of OLD, and
# `iscsi-perf`, each under `perf stat` (task-clock, context switches, page faults, syscalls):
# CPU and syscalls per command of each client against the same target (clients-sum.py).
set -e
NEW=$1; OLD=$2; D=$3; BS=${4:-1MiB}; DEPTH=${5:-16}; SECS=${6:-3}; REPS=${7:-3}
mkdir -p $D
port=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
IQN=iqn.2026-11.org.ipsan:clients
$OLD target --portal 127.0.0.1:$port --iqn $IQN --lun mem:256MiB > $D/target.log 2>&1 &
TP=$!
trap 'kill $TP 2>/dev/null; wait $TP 2>/dev/null' EXIT
for i in $(seq 50); do grep -q "listening on" $D/target.log && break; sleep 0.1; done
URL=iscsi://127.0.0.1:$port/$IQN/0
$OLD bench $URL --rw write --bs 1MiB --depth 8 --size 256MiB --quiet >/dev/null
EV=task-clock,context-switches,page-faults,raw_syscalls:sys_enter
BLK=$(python3 -c "b='$BS'; print((int(b[:-3])<<10 if b.endswith('KiB') else int(b[:-3])<<20)//512)")
echo "halt poll ns: $(cat /sys/module/haltpoll/parameters/guest_halt_poll_ns)" >> $D/loadavg.txt
for rep in $(seq $REPS); do
  case $((rep % 3)) in 1) order="new old perf";; 2) order="old perf new";; 0) order="perf new old";; esac
  for side in $order; do
    if [ $side = perf ]; then
      perf stat -e $EV -o $D/stat-$side-$rep.txt timeout -s INT $SECS iscsi-perf -m $DEPTH -b $BLK $URL > $D/out-$side-$rep.txt 2>&1 || true
    else
      if [ $side = new ]; then B=$NEW; else B=$OLD; fi
      perf stat -e $EV -o $D/stat-$side-$rep.txt $B bench $URL --rw read --bs $BS --depth $DEPTH --time ${SECS}s --json $D/bench-$side-$rep.json --quiet > $D/out-$side-$rep.txt 2>&1
    fi
    echo "rep $rep $side: $(cat /proc/loadavg)" >> $D/loadavg.txt
  done
done
