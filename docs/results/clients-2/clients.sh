#!/bin/bash
# clients.sh BIN REF OUTDIR RW BS DEPTH [SECS REPS] — issue 27's "ipsan bench ÷ iscsi-perf, same
# target, alternated": one `ipsan target` of BIN (mem: LUN of 256 MiB, written once), its clients
# in turn for SECS each, the order rotating rep by rep (reversed on even reps), each under
# `perf stat` on the client AND on the target (-p), so counts per command come with every run
# (sum.py).
#   reads  (RW=read):  new  = BIN's `ipsan bench` (keeps the data, the default),
#                      disc = BIN's `ipsan bench --sink discard` (drops it as it arrives),
#                      ref  = REF's `ipsan bench` (keeps it), perf = `iscsi-perf -m DEPTH -b BLOCKS`
#   writes (RW=write): new, ref, and qemu = `qemu-img bench -w` (libiscsi through QEMU's block
#                      layer; libiscsi's iscsi-perf 1.19 cannot write), QCOUNT commands
#                      (default: what takes it ~SECS at 1,000 MiB/s, at least 2000).
# SIDES="new ref" (say) runs only those. Root (perf stat -p on the target). Everything it starts is stopped on exit.
set -e
BIN=$1; REF=$2; D=$3; RW=$4; BS=$5; DEPTH=$6; SECS=${7:-5}; REPS=${8:-5}
mkdir -p $D
port=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
IQN=iqn.2026-11.org.ipsan:clients2
$BIN target --portal 127.0.0.1:$port --iqn $IQN --lun mem:256MiB > $D/target.log 2>&1 &
TP=$!
trap 'kill $TP 2>/dev/null; wait $TP 2>/dev/null' EXIT
for i in $(seq 50); do grep -q "listening on" $D/target.log && break; sleep 0.1; done
URL=iscsi://127.0.0.1:$port/$IQN/0
$BIN bench $URL --rw write --bs 1MiB --depth 8 --size 256MiB --quiet >/dev/null
EV=task-clock,context-switches,page-faults,raw_syscalls:sys_enter,syscalls:sys_enter_recvfrom,syscalls:sys_enter_writev,syscalls:sys_enter_epoll_wait,syscalls:sys_enter_readv,syscalls:sys_enter_poll,syscalls:sys_enter_ppoll,syscalls:sys_enter_sendmsg,syscalls:sys_enter_sendto,syscalls:sys_enter_write,syscalls:sys_enter_read
BYTES=$(python3 -c "b='$BS'; print(int(b[:-3])<<10 if b.endswith('KiB') else int(b[:-3])<<20)")
BLK=$((BYTES / 512))
QCOUNT=${QCOUNT:-$(python3 -c "print(max(2000, $SECS * 1000 * 2**20 // $BYTES))")}
if [ -z "$SIDES" ]; then if [ "$RW" = read ]; then SIDES="new disc ref perf"; else SIDES="new ref qemu"; fi; fi
echo "BIN=$BIN REF=$REF RW=$RW BS=$BS DEPTH=$DEPTH SECS=$SECS REPS=$REPS QCOUNT=$QCOUNT sides: $SIDES" > $D/run.txt
for b in $BIN $REF; do sha256sum $b >> $D/run.txt; done
for rep in $(seq $REPS); do
  # Rotated rep by rep, and reversed on even reps, so no side always follows the same one
  # (the first run had `new` right after `perf` in every rep).
  order=$(python3 -c "import sys;s=sys.argv[1].split();r=int(sys.argv[2]);o=s[r%len(s):]+s[:r%len(s)];print(' '.join(o[::-1] if r%2==0 else o))" "$SIDES" $rep)
  for side in $order; do
    perf stat -e $EV -p $TP -o $D/tstat-$side-$rep.txt & SP=$!
    sleep 0.2
    B="--rw $RW --bs $BS --depth $DEPTH --time ${SECS}s --json $D/bench-$side-$rep.json --quiet"
    case $side in
      perf) perf stat -e $EV -o $D/stat-$side-$rep.txt timeout -s INT $SECS iscsi-perf -m $DEPTH -b $BLK $URL > $D/out-$side-$rep.txt 2>&1 || true ;;
      qemu) perf stat -e $EV -o $D/stat-$side-$rep.txt qemu-img bench -f raw -t none -c $QCOUNT -d $DEPTH -s $BYTES -w $URL > $D/out-$side-$rep.txt 2>&1 ;;
      new) perf stat -e $EV -o $D/stat-$side-$rep.txt $BIN bench $URL $B > $D/out-$side-$rep.txt 2>&1 ;;
      disc) perf stat -e $EV -o $D/stat-$side-$rep.txt $BIN bench $URL $B --sink discard > $D/out-$side-$rep.txt 2>&1 ;;
      ref) perf stat -e $EV -o $D/stat-$side-$rep.txt $REF bench $URL $B > $D/out-$side-$rep.txt 2>&1 ;;
    esac
    kill -INT $SP; wait $SP || true
    echo "rep $rep $side: $(cat /proc/loadavg)" >> $D/loadavg.txt
  done
done
