#!/bin/bash
# pf.sh OUT BIN CELL SIDE: page faults of the bench (call graphs), 4 s run
set -e
OUT=$1; BIN=$2; CELL=$3; SIDE=$4; shift 4
RW=${CELL%%/*}; R=${CELL#*/}; BS=${R%%/*}; DEPTH=${R#*/}
mkdir -p $OUT
free_port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
port=$(free_port); nport=$(free_port)
IQN=iqn.2026-11.org.ipsan:pf
$BIN target --portal 127.0.0.1:$port --iqn $IQN --lun mem:1GiB --nvme-listen 127.0.0.1:$nport > $OUT/target.log 2>&1 &
TP=$!
trap 'kill $TP 2>/dev/null' EXIT
for i in $(seq 100); do grep -q "serving nvme+tcp" $OUT/target.log && break; sleep 0.1; done
ISCSI=iscsi://127.0.0.1:$port/$IQN/0
NVME=$(grep -o 'nvme+tcp://[^ ]*' $OUT/target.log | head -1)
$BIN bench $ISCSI --rw write --bs 1MiB --depth 8 --size 1GiB --quiet > /dev/null
case $SIDE in iscsi) URL=$ISCSI; X="";; nvme) URL=$NVME; X="--queues 2";; esac
perf record -e page-faults -c 1 -g -o $OUT/pf-bench.data -- $BIN bench $URL $X --rw $RW --bs $BS --depth $DEPTH --time 4s --quiet --json $OUT/bench.json "$@" > /dev/null 2>$OUT/bench.err
perf report -i $OUT/pf-bench.data --no-children --sort sym --stdio -G 2>/dev/null | grep -v "^#" | grep -v "^$" | head -120 > $OUT/pf.txt
python3 -c "import json;r=json.load(open('$OUT/bench.json'))['result'];print(r['throughput_mib_s'], r['bytes'])"
