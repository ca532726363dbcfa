#!/bin/bash
# prof-read.sh BIN OUTDIR [BS DEPTH SECS]: one ipsan target (BIN, mem: LUN); `iscsi-perf` and
# `ipsan bench --rw read` against it in turn, each under `perf record -F 1999 -g` (cpu-clock
# samples: this VM has no hardware counters; kernel call chains), the target recorded too;
# per side a flat symbol table (OUTDIR/report-*.txt) and the kernel callers of the top kernel
# symbols (OUTDIR/callers-*.txt). The perf.data files are not kept.
set -e
BIN=$1; D=$2; BS=${3:-1MiB}; DEPTH=${4:-16}; SECS=${5:-4}
mkdir -p $D
port=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
IQN=iqn.2026-11.org.ipsan:prof
$BIN target --portal 127.0.0.1:$port --iqn $IQN --lun mem:256MiB > $D/target.log 2>&1 &
TP=$!
trap 'kill $TP 2>/dev/null; wait $TP 2>/dev/null' EXIT
for i in $(seq 50); do grep -q "listening on" $D/target.log && break; sleep 0.1; done
URL=iscsi://127.0.0.1:$port/$IQN/0
$BIN bench $URL --rw write --bs 1MiB --depth 8 --size 256MiB --quiet >/dev/null
BLK=$(python3 -c "b='$BS'; print((int(b[:-3])<<10 if b.endswith('KiB') else int(b[:-3])<<20)//512)")
for side in perf ipsan; do
  perf record -F 1999 -g -o $D/t-$side.data -p $TP 2>/dev/null &
  SP=$!
  sleep 0.3
  if [ $side = perf ]; then
    perf record -F 1999 -g -o $D/c-$side.data timeout -s INT $SECS iscsi-perf -m $DEPTH -b $BLK $URL > $D/out-$side.txt 2>&1 || true
  else
    perf record -F 1999 -g -o $D/c-$side.data $BIN bench $URL --rw read --bs $BS --depth $DEPTH --time ${SECS}s --json $D/bench-prof.json --quiet > $D/out-$side.txt 2>&1
  fi
  kill -INT $SP; wait $SP || true
  echo "$side: $(cat /proc/loadavg)" >> $D/loadavg.txt
  for w in c t; do
    perf report -i $D/$w-$side.data --no-children -g none --sort comm,dso,sym --stdio 2>/dev/null | grep -v '^#' | grep -v '^$' | head -60 > $D/report-$w-$side.txt
    perf report -i $D/$w-$side.data --no-children --symbols=clear_page_erms,_raw_spin_unlock_irqrestore,__free_frozen_pages,finish_task_switch.isra.0 -g caller,0.5,callee,function,percent --stdio 2>/dev/null | grep -v '^#' | grep -v '^$' | head -150 > $D/callers-$w-$side.txt
    rm -f $D/$w-$side.data
  done
done
