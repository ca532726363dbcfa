#!/bin/bash
# counts.sh BIN REF OUTDIR RW BS DEPTH N1 N2 — load-independent costs per `ipsan bench` command
# against one native `ipsan target` of BIN (1 GiB RAM LUN, written once): each client counted
# at N1 and N2 commands, so (count(N2) - count(N1)) / (N2 - N1) is one command without start-up
# (../refactor-ab/w64-counts/sum.py reads the files). Clients: new (BIN), disc (BIN --sink
# discard; reads only), ref (REF). MODES (default perf,cg): perf = perf stat on the client and
# the target (-p); cg = the client under valgrind --tool=callgrind.
set -e
BIN=$1; REF=$2; D=$3; RW=${4:-read}; BS=${5:-1MiB}; DEPTH=${6:-16}; N1=${7:-200}; N2=${8:-600}
MODES=${MODES:-perf,cg}
mkdir -p "$D"
bs_bytes=$(python3 -c "import sys;s=sys.argv[1];u={'KiB':1024,'MiB':1<<20};print(int(s[:-3])*u[s[-3:]])" "$BS")
port=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
IQN=iqn.2026-11.org.ipsan:counts2
"$BIN" target --portal 127.0.0.1:$port --iqn $IQN --lun mem:1GiB > "$D/target.log" 2>&1 &
TP=$!
trap 'kill $TP 2>/dev/null; wait $TP 2>/dev/null' EXIT
for i in $(seq 50); do grep -q "listening on" "$D/target.log" && break; sleep 0.1; done
URL=iscsi://127.0.0.1:$port/$IQN/0
"$BIN" bench $URL --rw write --bs 1MiB --depth 16 --size $(( (N2 * bs_bytes + (1 << 20) - 1) >> 20 << 20 )) --quiet > /dev/null
EV=context-switches,cpu-migrations,task-clock,page-faults,raw_syscalls:sys_enter,syscalls:sys_enter_read,syscalls:sys_enter_recvfrom,syscalls:sys_enter_readv,syscalls:sys_enter_write,syscalls:sys_enter_writev,syscalls:sys_enter_sendmsg,syscalls:sys_enter_epoll_wait,syscalls:sys_enter_futex,syscalls:sys_enter_mmap,syscalls:sys_enter_munmap,syscalls:sys_enter_madvise
CLIENTS="new ref"; [ "$RW" = read ] && CLIENTS="new disc ref"
run() { # $1 client, $2 N, $3 tag, $4.. prefix
  local c=$1 n=$2 tag=$3; shift 3
  local b=$BIN extra=""
  [ $c = ref ] && b=$REF
  [ $c = disc ] && extra="--sink discard"
  "$@" "$b" bench $URL --rw $RW --bs $BS --depth $DEPTH --size $((n * bs_bytes)) --quiet $extra --json "$D/bench-$tag-$n.json" > /dev/null 2>> "$D/bench.log"
}
for c in $CLIENTS; do
  TAG="$c-$RW$BS-d$DEPTH"
  if [[ ,$MODES, == *,perf,* ]]; then
    for n in $N1 $N2; do
      perf stat -e $EV -p $TP -o "$D/perf-target-$TAG-$n.txt" & SP=$!
      sleep 0.3
      run $c $n $TAG perf stat -e $EV -o "$D/perf-bench-$TAG-$n.txt"
      sleep 0.1
      kill -INT $SP; wait $SP || true
    done
  fi
  if [[ ,$MODES, == *,cg,* ]]; then
    for n in $N1 $N2; do
      run $c $n cg-$TAG valgrind --tool=callgrind --callgrind-out-file="$D/cg-bench-$TAG-$n.out"
      gzip -f "$D/cg-bench-$TAG-$n.out"
    done
  fi
done
cat /proc/loadavg > "$D/loadavg-$RW$BS-d$DEPTH.txt"
