#!/bin/bash
# faults.sh BIN OUTDIR [BS DEPTH COUNT] — where the target's page faults and madvise calls come
# from under `qemu-img bench -w` (1 MiB x 16 by default): perf record of page-faults and of
# madvise entries with call chains on the target (-p), reported by caller.
set -e
BIN=$1; D=$2; BS=${3:-1048576}; DEPTH=${4:-16}; COUNT=${5:-400}
mkdir -p $D
port=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
IQN=iqn.2026-11.org.ipsan:faults
$BIN target --portal 127.0.0.1:$port --iqn $IQN --lun mem:1GiB > $D/target.log 2>&1 &
TP=$!
trap 'kill $TP 2>/dev/null; wait $TP 2>/dev/null' EXIT
for i in $(seq 50); do grep -q "listening on" $D/target.log && break; sleep 0.1; done
URL=iscsi://127.0.0.1:$port/$IQN/0
$BIN bench $URL --rw write --bs 1MiB --depth 16 --size 1GiB --quiet >/dev/null
perf record -e page-faults,syscalls:sys_enter_madvise --call-graph dwarf,16384 -o $D/t.data -p $TP 2>/dev/null & SP=$!
sleep 0.3
qemu-img bench -f raw -t none -c $COUNT -d $DEPTH -s $BS -w $URL > $D/client.txt 2>&1
kill -INT $SP; wait $SP || true
perf report -i $D/t.data --no-children --stdio -g caller,0.5,callee,function,percent 2>/dev/null | grep -v '^$' | head -200 > $D/report.txt
rm -f $D/t.data
