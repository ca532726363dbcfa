#!/bin/bash
# usage: prof.sh BIN PORT SIZE
BIN=$1; PORT=$2; SIZE=$3
IQN=iqn.2026-11.org.ipsan:cell
$BIN target --portal 127.0.0.1:$PORT --iqn $IQN --lun mem:1GiB >/tmp/eng/t-$PORT.log 2>&1 &
TP=$!
sleep 1
URL=iscsi://127.0.0.1:$PORT/$IQN/0
$BIN bench $URL --rw write --bs 1MiB --depth 16 --size 1GiB --quiet >/dev/null
perf record -F 4000 -o /tmp/eng/p-tgt-$PORT.data -p $TP 2>/dev/null &
PP=$!
perf record -F 4000 -o /tmp/eng/p-ini-$PORT.data -- $BIN bench $URL --rw read --bs 64KiB --depth 1 --size $SIZE --quiet --json /tmp/eng/r-$PORT.json --threads 2 >/dev/null 2>&1
kill -INT $PP; wait $PP
python3 -c "import json;print('$BIN', json.load(open('/tmp/eng/r-$PORT.json'))['result']['throughput_mib_s'])"
kill $TP; wait $TP 2>/dev/null
