#!/bin/bash
# counts.sh OUTDIR CELL N1 N2 BIN... — load-independent costs per command of one cell
# (rw/bs/depth, e.g. write/1MiB/16) for iSCSI and NVMe/TCP side by side (SIDES, default
# "iscsi nvme"; nvme = `--queues 2`, as the nvme-vs-iscsi table runs it), each side counted
# on its own at N1 and N2 commands (`--size N × bs`), so (count(N2) − count(N1)) / (N2 − N1)
# is one command without start-up, connection set-up and logout (../per-command-cost-4's
# counts.sh with an NVMe/TCP listener beside the portal). MODES (default
# perf,cg-target,cg-bench):
#   perf:      perf stat (system calls by name, context switches, page faults) on the target
#              (-p) and on `ipsan bench`, both native;
#   cg-target: the target under valgrind --tool=callgrind (a fresh one per N), bench native;
#   cg-bench:  `ipsan bench` under callgrind against a native target.
# Every target: 1 GiB RAM LUN, the region written once first (1 MiB × 16 over iSCSI), and
# TARGET_ARGS (e.g. "--nvme-in-capsule 64KiB") on its command line. ../nvme-speed-9/counts.sh
# with TARGET_ARGS.
set -e
D=$1; CELL=$2; N1=$3; N2=$4; shift 4
RW=${CELL%%/*}; R=${CELL#*/}; BS=${R%%/*}; DEPTH=${R#*/}
SIDES=${SIDES:-iscsi nvme}
MODES=${MODES:-perf,cg-target,cg-bench}
mkdir -p "$D"
bs_bytes=$(python3 -c "import sys;s=sys.argv[1];u={'KiB':1024,'MiB':1<<20};print(int(s[:-3])*u[s[-3:]])" "$BS")
fill=$(( (N2 * bs_bytes + (1 << 20) - 1) >> 20 << 20 ))
[ $fill -gt $((1 << 30)) ] && fill=$((1 << 30))
free_port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
IQN=iqn.2026-11.org.ipsan:counts11
TP=
trap '[ -n "$TP" ] && kill $TP 2>/dev/null; true' EXIT
start_target() { # $1 log, $2.. prefix (valgrind …)
  local log=$1; shift
  port=$(free_port); nport=$(free_port)
  "$@" "$BIN" target --portal 127.0.0.1:$port --iqn $IQN --lun mem:1GiB --nvme-listen 127.0.0.1:$nport $TARGET_ARGS > "$log" 2>&1 &
  TP=$!
  for i in $(seq 600); do grep -q "serving nvme+tcp" "$log" && break; sleep 0.1; done
  ISCSI=iscsi://127.0.0.1:$port/$IQN/0
  NVME=$(grep -o 'nvme+tcp://[^ ]*' "$log" | head -1)
  "$BIN" bench "$ISCSI" --rw write --bs 1MiB --depth 16 --size $fill --quiet >/dev/null
}
stop_target() { kill -TERM $TP 2>/dev/null; wait $TP 2>/dev/null || true; TP=; }
url() { case $1 in iscsi) echo "$ISCSI";; *) echo "$NVME";; esac; }
extra() { case $1 in nvme) echo "--queues 2";; nvme-q1) echo "--queues 1";; esac; }
bench() { # $1 side, $2 N, $3 json, $4.. prefix
  local p=$1 n=$2 j=$3; shift 3
  "$@" "$BIN" bench "$(url $p)" $(extra $p) --rw $RW --bs $BS --depth $DEPTH --size $((n * bs_bytes)) --quiet --json "$j" >/dev/null 2>>"$D/bench.log"
}
EV=context-switches,cpu-migrations,task-clock,page-faults,raw_syscalls:sys_enter,syscalls:sys_enter_read,syscalls:sys_enter_recvfrom,syscalls:sys_enter_recvmsg,syscalls:sys_enter_readv,syscalls:sys_enter_write,syscalls:sys_enter_writev,syscalls:sys_enter_sendto,syscalls:sys_enter_sendmsg,syscalls:sys_enter_epoll_wait,syscalls:sys_enter_futex,syscalls:sys_enter_sched_yield,syscalls:sys_enter_mmap,syscalls:sys_enter_munmap,syscalls:sys_enter_madvise
for BIN in "$@"; do
  L=$(basename "$BIN")
  if [[ ,$MODES, == *,perf,* ]]; then
    start_target "$D/target-$L-perf.log"
    for P in $SIDES; do
      for n in $N1 $N2; do
        T="$L-$P-$n"
        perf stat -e $EV -p $TP -o "$D/perf-target-$T.txt" & SP=$!
        sleep 0.3
        bench $P $n "$D/bench-perf-$T.json" perf stat -e $EV -o "$D/perf-bench-$T.txt"
        sleep 0.1
        kill -INT $SP; wait $SP || true
      done
    done
    stop_target
  fi
  if [[ ,$MODES, == *,cg-bench,* ]]; then
    start_target "$D/target-$L-cg-bench.log"
    for P in $SIDES; do
      for n in $N1 $N2; do
        bench $P $n "$D/bench-cgb-$L-$P-$n.json" valgrind --tool=callgrind --callgrind-out-file="$D/cg-bench-$L-$P-$n.out"
      done
    done
    stop_target
  fi
  if [[ ,$MODES, == *,cg-target,* ]]; then
    for P in $SIDES; do
      for n in $N1 $N2; do
        start_target "$D/target-$L-$P-$n.log" valgrind --tool=callgrind --callgrind-out-file="$D/cg-target-$L-$P-$n.out"
        bench $P $n "$D/bench-cgt-$L-$P-$n.json"
        stop_target
      done
    done
  fi
done
cat /proc/loadavg >> "$D/loadavg.txt"
