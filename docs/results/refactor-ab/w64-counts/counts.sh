#!/bin/bash
# counts.sh BIN LABEL OUTDIR [BS DEPTH N1 N2] — load-independent costs per command of
# `ipsan bench --rw write` against `ipsan target` (1 GiB RAM LUN, plain session, loopback),
# each side counted on its own: N1 and N2 commands of BS at DEPTH (defaults 64KiB, 1, 1000,
# 3000), so (count(N2) - count(N1)) / (N2 - N1) is the cost of one command without start-up,
# login and logout.
#   perf: perf stat (syscalls by name, context switches, task-clock) on the target (-p) and on
#         the bench, both native; the LUN is written once first (as scripts/bench seal does).
#   cg-target: the target under valgrind --tool=callgrind (a fresh one per N, the region
#         written once first; SIGTERM ends it cleanly and callgrind writes its totals), the
#         bench native.
#   cg-bench: the bench under callgrind against a native target.
# The bench runs as scripts/bench seal runs it (--threads 2; the target --crypto-workers 2).
# SEAL=CIPHER (e.g. aes-256-gcm): a sealed session instead, started as `scripts/bench seal`
# starts one (the target --seal-secret-file KEY, the bench --seal CIPHER --secret-file KEY
# --crypto-workers 2; a fresh 32-byte key in a temporary directory, mode 0600, removed at
# exit); the tag gets -CIPHER. The LUN is written first by a plain session, as there.
set -e
BIN=$1; L=$2; D=$3; BS=${4:-64KiB}; DEPTH=${5:-1}; N1=${6:-1000}; N2=${7:-3000}
MODES=${MODES:-perf,cg-target,cg-bench}
mkdir -p "$D"
bs_bytes=$(python3 -c "import sys;s=sys.argv[1];u={'KiB':1024,'MiB':1<<20};print(int(s[:-3])*u[s[-3:]])" "$BS")
free_port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
IQN=iqn.2026-11.org.ipsan:counts
TAG="$L-w$BS-d$DEPTH${SEAL:+-$SEAL}"
TSEAL=(); BSEAL=()
if [[ -n $SEAL ]]; then
  KD=$(mktemp -d); KEY=$KD/seal.key
  (umask 077; python3 -c 'import os;print(os.urandom(32).hex())' > "$KEY")
  TSEAL=(--seal-secret-file "$KEY"); BSEAL=(--seal "$SEAL" --secret-file "$KEY" --crypto-workers 2)
fi
wait_port() { for i in $(seq 600); do python3 -c "import socket,sys;socket.create_connection(('127.0.0.1',$1),timeout=0.2).close()" 2>/dev/null && return 0; sleep 0.1; done; return 1; }
start_target() { # $1 port, $2.. prefix command (valgrind …)
  local port=$1; shift
  "$@" "$BIN" target --portal 127.0.0.1:$port --iqn $IQN --lun mem:1GiB --crypto-workers 2 "${TSEAL[@]}" > "$D/target-$TAG.log" 2>&1 &
  TP=$!
  wait_port $port
}
stop_target() { kill -TERM $TP 2>/dev/null; wait $TP 2>/dev/null || true; }
bench() { # $1 mode, $2 url, $3 N, $4.. prefix
  local m=$1 url=$2 n=$3; shift 3
  "$@" "$BIN" bench "$url" --rw write --bs $BS --depth $DEPTH --size $((n * bs_bytes)) --quiet --threads 2 "${BSEAL[@]}" --json "$D/bench-$m-$TAG-$n.json" > /dev/null 2>> "$D/bench-$TAG.log"
}
trap 'kill $TP 2>/dev/null || true; if [[ -n $KD ]]; then rm -rf "$KD"; fi' EXIT
EV=context-switches,cpu-migrations,task-clock,page-faults,raw_syscalls:sys_enter,syscalls:sys_enter_read,syscalls:sys_enter_recvfrom,syscalls:sys_enter_recvmsg,syscalls:sys_enter_readv,syscalls:sys_enter_write,syscalls:sys_enter_writev,syscalls:sys_enter_sendto,syscalls:sys_enter_sendmsg,syscalls:sys_enter_epoll_wait,syscalls:sys_enter_epoll_pwait,syscalls:sys_enter_futex,syscalls:sys_enter_sched_yield,syscalls:sys_enter_mmap,syscalls:sys_enter_munmap,syscalls:sys_enter_madvise,syscalls:sys_enter_brk,syscalls:sys_enter_mremap
if [[ ,$MODES, == *,perf,* ]]; then
  port=$(free_port); start_target $port
  URL=iscsi://127.0.0.1:$port/$IQN/0
  "$BIN" bench "$URL" --rw write --bs 1MiB --depth 16 --size 1GiB --quiet > /dev/null
  for n in $N1 $N2; do
    perf stat -e $EV -p $TP -o "$D/perf-target-$TAG-$n.txt" & SP=$!
    sleep 0.3
    bench perf "$URL" $n perf stat -e $EV -o "$D/perf-bench-$TAG-$n.txt"
    sleep 0.1
    kill -INT $SP; wait $SP || true
  done
  stop_target
fi
if [[ ,$MODES, == *,cg-target,* ]]; then
  for n in $N1 $N2; do
    port=$(free_port)
    start_target $port valgrind --tool=callgrind --callgrind-out-file="$D/cg-target-$TAG-$n.out"
    # The region written once first (counted alike at N1 and N2): no first write of a RAM
    # chunk, and no allocator state that depends on one, in what the subtraction leaves.
    "$BIN" bench iscsi://127.0.0.1:$port/$IQN/0 --rw write --bs 1MiB --depth 16 --size $(( (N2 * bs_bytes + (1 << 20) - 1) >> 20 << 20 )) --quiet > /dev/null
    bench cg-target iscsi://127.0.0.1:$port/$IQN/0 $n
    stop_target
  done
fi
if [[ ,$MODES, == *,cg-bench,* ]]; then
  port=$(free_port); start_target $port
  for n in $N1 $N2; do
    bench cg-bench iscsi://127.0.0.1:$port/$IQN/0 $n valgrind --tool=callgrind --callgrind-out-file="$D/cg-bench-$TAG-$n.out"
  done
  stop_target
fi
cat /proc/loadavg > "$D/loadavg-$TAG.txt"
