#!/bin/bash
# prof-client.sh BIN OUTDIR RW N: perf record (call graphs) of qemu-img bench 4KiB x32 against `ipsan target`
set -e
BIN=$1; D=$2; RW=$3; N=${4:-60000}
mkdir -p $D
port=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
IQN=iqn.2026-11.org.ipsan:prof
$BIN target --portal 127.0.0.1:$port --iqn $IQN --lun mem:1GiB > $D/target-$RW.log 2>&1 & TP=$!
trap 'kill $TP 2>/dev/null' EXIT
for i in $(seq 100); do python3 -c "import socket;socket.create_connection(('127.0.0.1',$port),timeout=0.2).close()" 2>/dev/null && break; sleep 0.1; done
URL=iscsi://127.0.0.1:$port/$IQN/0
$BIN bench $URL --rw write --bs 1MiB --depth 16 --size 256MiB --quiet > /dev/null
perf record -F 4999 -g -o $D/perf-client-$RW.data -- qemu-img bench -f raw -t none -c $N -d 32 -s 4096 $([ $RW = write ] && echo -w) $URL > $D/client-$RW.txt 2>&1
perf record -F 4999 -g -p $TP -o $D/perf-target-$RW.data -- sleep 0 2>/dev/null || true
