#!/bin/bash
# run.sh NEW OLD: ipsan bench 1 MiB x 16 sequential reads (one runtime thread, bench's default),
# 4 s per run, each binary against its own target (256 MiB mem: LUN, filled once), alternated
# over 3 reps (rep 2 reversed); perf stat counts the bench's CPU, syscalls and context switches.
N=$1; O=$2; D=${3:-.}
for rep in 1 2 3; do for B in $N $O; do
  [ $rep = 2 ] && B=$([ $B = $N ] && echo $O || echo $N)
  L=$(basename $B)
  port=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
  $B target --portal 127.0.0.1:$port --iqn iqn.2026-11.org.ipsan:t1 --lun mem:256MiB > /tmp/t1.log 2>&1 & TP=$!
  sleep 0.5; U=iscsi://127.0.0.1:$port/iqn.2026-11.org.ipsan:t1/0
  $B bench $U --rw write --bs 1MiB --depth 8 --size 256MiB --quiet >/dev/null
  perf stat -e task-clock,raw_syscalls:sys_enter,context-switches -o $D/stat-$L-$rep.txt \
    $B bench $U --rw read --bs 1MiB --depth 16 --time 4s --quiet --json $D/bench-$L-$rep.json >/dev/null 2>&1
  kill $TP; wait $TP 2>/dev/null
done; done
