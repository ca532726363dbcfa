#!/bin/bash
# clients-target.sh BIN OUTDIR [BS DEPTH SECS REPS] — one `ipsan target` of BIN (mem: LUN,
# written once first); its clients in turn, the order rotating rep by rep: `ipsan bench --rw
# read` of BIN with its default runtime (one thread), the same with --threads 2, and
# `iscsi-perf`; each for SECS under `perf stat` on BOTH the client and the target (-p), so the
# target's syscalls and context switches per command can be set beside each client's
# (clients-target-sum.py). EXTRA_BIN=PATH adds `ipsan bench` of a second binary (side `b2`).
set -e
BIN=$1; D=$2; BS=${3:-1MiB}; DEPTH=${4:-16}; SECS=${5:-3}; REPS=${6:-3}
mkdir -p $D
port=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
IQN=iqn.2026-11.org.ipsan:clients
$BIN target --portal 127.0.0.1:$port --iqn $IQN --lun mem:256MiB > $D/target.log 2>&1 &
TP=$!
trap 'kill $TP 2>/dev/null; wait $TP 2>/dev/null' EXIT
for i in $(seq 50); do grep -q "listening on" $D/target.log && break; sleep 0.1; done
URL=iscsi://127.0.0.1:$port/$IQN/0
$BIN bench $URL --rw write --bs 1MiB --depth 8 --size 256MiB --quiet >/dev/null
EV=task-clock,context-switches,page-faults,raw_syscalls:sys_enter,syscalls:sys_enter_recvfrom,syscalls:sys_enter_writev,syscalls:sys_enter_epoll_wait,syscalls:sys_enter_readv,syscalls:sys_enter_poll,syscalls:sys_enter_sendmsg,syscalls:sys_enter_write,syscalls:sys_enter_read
BLK=$(python3 -c "b='$BS'; print((int(b[:-3])<<10 if b.endswith('KiB') else int(b[:-3])<<20)//512)")
SIDES="t1 t2 perf"; [ -n "$EXTRA_BIN" ] && SIDES="$SIDES b2"
for rep in $(seq $REPS); do
  order=$(python3 -c "import sys;s=sys.argv[1].split();r=int(sys.argv[2]);print(' '.join(s[r%len(s):]+s[:r%len(s)]))" "$SIDES" $rep)
  for side in $order; do
    perf stat -e $EV -p $TP -o $D/tstat-$side-$rep.txt & SP=$!
    sleep 0.2
    case $side in
      perf) perf stat -e $EV -o $D/stat-$side-$rep.txt timeout -s INT $SECS iscsi-perf -m $DEPTH -b $BLK $URL > $D/out-$side-$rep.txt 2>&1 || true ;;
      t1) perf stat -e $EV -o $D/stat-$side-$rep.txt $BIN bench $URL --rw read --bs $BS --depth $DEPTH --time ${SECS}s --json $D/bench-$side-$rep.json --quiet > $D/out-$side-$rep.txt 2>&1 ;;
      t2) perf stat -e $EV -o $D/stat-$side-$rep.txt $BIN bench $URL --rw read --bs $BS --depth $DEPTH --time ${SECS}s --threads 2 --json $D/bench-$side-$rep.json --quiet > $D/out-$side-$rep.txt 2>&1 ;;
      b2) perf stat -e $EV -o $D/stat-$side-$rep.txt $EXTRA_BIN bench $URL --rw read --bs $BS --depth $DEPTH --time ${SECS}s --json $D/bench-$side-$rep.json --quiet > $D/out-$side-$rep.txt 2>&1 ;;
    esac
    kill -INT $SP; wait $SP || true
    echo "rep $rep $side: $(cat /proc/loadavg)" >> $D/loadavg.txt
  done
done
