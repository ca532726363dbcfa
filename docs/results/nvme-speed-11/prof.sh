#!/bin/bash
# prof.sh OUT BIN CELL SIDE [extra bench args] — perf record (cpu-clock, call graphs) of the bench and the target for one cell
set -e
OUT=$1; BIN=$2; CELL=$3; SIDE=$4; shift 4
RW=${CELL%%/*}; R=${CELL#*/}; BS=${R%%/*}; DEPTH=${R#*/}
mkdir -p $OUT
free_port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
port=$(free_port); nport=$(free_port)
IQN=iqn.2026-11.org.ipsan:prof
$BIN target --portal 127.0.0.1:$port --iqn $IQN --lun mem:1GiB --nvme-listen 127.0.0.1:$nport $TARGET_EXTRA > $OUT/target.log 2>&1 &
TP=$!
trap 'kill $TP 2>/dev/null' EXIT
for i in $(seq 100); do grep -q "serving nvme+tcp" $OUT/target.log && break; sleep 0.1; done
ISCSI=iscsi://127.0.0.1:$port/$IQN/0
NVME=$(grep -o 'nvme+tcp://[^ ]*' $OUT/target.log | head -1)
$BIN bench $ISCSI --rw write --bs 1MiB --depth 8 --size 1GiB --quiet > /dev/null
case $SIDE in iscsi) URL=$ISCSI; X="";; nvme) URL=$NVME; X="--queues 2";; esac
perf record -F 2000 -g -e cpu-clock -p $TP -o $OUT/perf-target.data 2>/dev/null &
PP=$!
sleep 0.2
perf record -F 2000 -g -e cpu-clock -o $OUT/perf-bench.data -- $BIN bench $URL $X --rw $RW --bs $BS --depth $DEPTH --time 3s --quiet --json $OUT/bench.json "$@" > /dev/null 2>$OUT/bench.err
kill -INT $PP; wait $PP || true
for s in bench target; do
  perf report -i $OUT/perf-$s.data --no-children --sort sym --stdio 2>/dev/null | grep -v "^#" | grep "%" | head -40 > $OUT/top-$s.txt
done
python3 -c "import json;r=json.load(open('$OUT/bench.json'))['result'];print(r['throughput_mib_s'], r['cpu'])"
