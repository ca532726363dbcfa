#!/bin/bash
# ab.sh OUTDIR REPS RW BS DEPTH N "LABEL=ENV BIN" ... : qemu-img bench against `ipsan target` variants,
# alternated, each with perf stat on target and client (per-command counts = count / N incl. start-up).
D=$1; REPS=$2; RW=$3; BS=$4; DEPTH=$5; N=$6; shift 6
mkdir -p $D
IQN=iqn.2026-11.org.ipsan:ab
EV=context-switches,task-clock,raw_syscalls:sys_enter,syscalls:sys_enter_recvfrom,syscalls:sys_enter_writev,syscalls:sys_enter_epoll_wait,syscalls:sys_enter_sendto,syscalls:sys_enter_ppoll
bs_bytes=$(python3 -c "import sys;s=sys.argv[1];u={'KiB':1024,'MiB':1<<20};print(int(s[:-3])*u[s[-3:]])" "$BS")
for rep in $(seq $REPS); do
  for v in "$@"; do
    L=${v%% *}; rest=${v#* }; ENVS=${rest% *}; BIN=${rest##* }
    port=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
    env $ENVS $BIN target --portal 127.0.0.1:$port --iqn $IQN --lun mem:1GiB > $D/target-$L.log 2>&1 & TP=$!
    for i in $(seq 100); do python3 -c "import socket;socket.create_connection(('127.0.0.1',$port),timeout=0.2).close()" 2>/dev/null && break; sleep 0.1; done
    URL=iscsi://127.0.0.1:$port/$IQN/0
    $BIN bench $URL --rw write --bs 1MiB --depth 16 --size 512MiB --quiet > /dev/null
    nstat -n > /dev/null
    perf stat -e $EV -p $TP -o $D/perf-target-$L-$rep.txt & SP=$!
    sleep 0.2
    perf stat -e $EV -o $D/perf-client-$L-$rep.txt qemu-img bench -f raw -t none -c $N -d $DEPTH -s $bs_bytes $([ $RW = write ] && echo -w) $URL > $D/client-$L-$rep.txt 2>&1
    kill -INT $SP; wait $SP
    nstat > $D/nstat-$L-$rep.txt
    kill $TP; wait $TP 2>/dev/null
    echo "$rep $L $(grep -o 'in [0-9.]* seconds' $D/client-$L-$rep.txt) load $(cut -d' ' -f1 /proc/loadavg) $(awk '/TCPLossProbes |TcpRetransSegs |TCPToZeroWindowAdv |TcpExtDelayedACKs /{printf "%s=%s ",$1,$2}' $D/nstat-$L-$rep.txt)" | tee -a $D/summary.txt
  done
done
