#!/bin/bash
# counts.sh BIN LABEL OUTDIR RW BS DEPTH N1 N2 — load-independent costs per command against
# `ipsan target` (1 GiB RAM LUN, plain session, loopback, the LUN written once first), each
# side counted on its own at N1 and N2 commands, so (count(N2) - count(N1)) / (N2 - N1) is one
# command without start-up, login and logout (../../refactor-ab/w64-counts/counts.sh, with
# reads and a second client). MODES (comma list, default perf,cg-target,cg-bench):
#   perf:      perf stat (syscalls by name, context switches, page faults) on the target (-p)
#              and on the client, both native.
#   cg-target: the target under valgrind --tool=callgrind (a fresh one per N), client native.
#   cg-bench:  the client under callgrind against a native target (ipsan bench only).
# CLIENT: `ipsan` (default: `ipsan bench`, default threads as scripts/bench peers runs it) or
# `qemu` (`qemu-img bench -c N`, libiscsi, as scripts/bench peers' neutral client).
set -e
BIN=$1; L=$2; D=$3; RW=${4:-read}; BS=${5:-64KiB}; DEPTH=${6:-1}; N1=${7:-1000}; N2=${8:-3000}
MODES=${MODES:-perf,cg-target,cg-bench}; CLIENT=${CLIENT:-ipsan}
mkdir -p "$D"
bs_bytes=$(python3 -c "import sys;s=sys.argv[1];u={'KiB':1024,'MiB':1<<20};print(int(s[:-3])*u[s[-3:]])" "$BS")
free_port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
IQN=iqn.2026-11.org.ipsan:counts
TAG="$L-$CLIENT-$RW$BS-d$DEPTH"
wait_port() { for i in $(seq 600); do python3 -c "import socket,sys;socket.create_connection(('127.0.0.1',$1),timeout=0.2).close()" 2>/dev/null && return 0; sleep 0.1; done; return 1; }
start_target() { # $1 port, $2.. prefix command (valgrind …)
  local port=$1; shift
  "$@" "$BIN" target --portal 127.0.0.1:$port --iqn $IQN --lun mem:1GiB > "$D/target-$TAG.log" 2>&1 &
  TP=$!
  wait_port $port
}
stop_target() { kill -TERM $TP 2>/dev/null; wait $TP 2>/dev/null || true; }
fill() { "$BIN" bench "$1" --rw write --bs 1MiB --depth 16 --size $(( (N2 * bs_bytes + (1 << 20) - 1) >> 20 << 20 )) --quiet > /dev/null; }
client() { # $1 mode, $2 url, $3 N, $4.. prefix
  local m=$1 url=$2 n=$3; shift 3
  if [ "$CLIENT" = qemu ]; then
    "$@" qemu-img bench -f raw -t none -c $n -d $DEPTH -s $bs_bytes $([ $RW = write ] && echo -w) "$url" > "$D/client-$m-$TAG-$n.txt" 2>&1
  else
    "$@" "$BIN" bench "$url" --rw $RW --bs $BS --depth $DEPTH --size $((n * bs_bytes)) --quiet --json "$D/bench-$m-$TAG-$n.json" > /dev/null 2>> "$D/bench-$TAG.log"
  fi
}
trap 'kill $TP 2>/dev/null || true' EXIT
EV=context-switches,cpu-migrations,task-clock,page-faults,raw_syscalls:sys_enter,syscalls:sys_enter_read,syscalls:sys_enter_recvfrom,syscalls:sys_enter_recvmsg,syscalls:sys_enter_readv,syscalls:sys_enter_write,syscalls:sys_enter_writev,syscalls:sys_enter_sendto,syscalls:sys_enter_sendmsg,syscalls:sys_enter_epoll_wait,syscalls:sys_enter_epoll_pwait,syscalls:sys_enter_ppoll,syscalls:sys_enter_poll,syscalls:sys_enter_futex,syscalls:sys_enter_sched_yield,syscalls:sys_enter_mmap,syscalls:sys_enter_munmap,syscalls:sys_enter_madvise,syscalls:sys_enter_brk,syscalls:sys_enter_io_uring_enter
if [[ ,$MODES, == *,perf,* ]]; then
  port=$(free_port); start_target $port
  URL=iscsi://127.0.0.1:$port/$IQN/0
  fill "$URL"
  for n in $N1 $N2; do
    perf stat -e $EV -p $TP -o "$D/perf-target-$TAG-$n.txt" & SP=$!
    sleep 0.3
    client perf "$URL" $n perf stat -e $EV -o "$D/perf-bench-$TAG-$n.txt"
    sleep 0.1
    kill -INT $SP; wait $SP || true
  done
  stop_target
fi
if [[ ,$MODES, == *,cg-target,* ]]; then
  for n in $N1 $N2; do
    port=$(free_port)
    start_target $port valgrind --tool=callgrind --callgrind-out-file="$D/cg-target-$TAG-$n.out"
    fill iscsi://127.0.0.1:$port/$IQN/0
    client cg-target iscsi://127.0.0.1:$port/$IQN/0 $n
    stop_target
  done
fi
if [[ ,$MODES, == *,cg-bench,* ]]; then
  port=$(free_port); start_target $port
  fill iscsi://127.0.0.1:$port/$IQN/0
  for n in $N1 $N2; do
    client cg-bench iscsi://127.0.0.1:$port/$IQN/0 $n valgrind --tool=callgrind --callgrind-out-file="$D/cg-bench-$TAG-$n.out"
  done
  stop_target
fi
cat /proc/loadavg > "$D/loadavg-$TAG.txt"
