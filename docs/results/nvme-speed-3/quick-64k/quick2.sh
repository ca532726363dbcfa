#!/bin/bash
# BIN RW BS DEPTH REPS: plain nvme, default vs --sq-flow-control, order alternating per rep
BIN=$1; RW=$2; BS=$3; D=$4; REPS=${5:-3}
P=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
N=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
$BIN target --portal 127.0.0.1:$P --iqn iqn.2026-11.org.ipsan:q --lun mem:1GiB --nvme-listen 127.0.0.1:$N > /tmp/q-$$.log 2>&1 &
T=$!
for i in $(seq 100); do grep -q "serving nvme" /tmp/q-$$.log && break; sleep 0.1; done
U=$(grep -o 'nvme+tcp://[^ ]*' /tmp/q-$$.log | head -1)
$BIN bench iscsi://127.0.0.1:$P/iqn.2026-11.org.ipsan:q/0 --rw write --bs 1MiB --depth 16 --size 1GiB --quiet > /dev/null
for r in $(seq $REPS); do
  if [ $((r % 2)) = 1 ]; then order="succ sqfc"; else order="sqfc succ"; fi
  for o in $order; do
    extra=; [ $o = sqfc ] && extra=--sq-flow-control
    $BIN bench $U --rw $RW --bs $BS --depth $D --time 2s --queues 2 --quiet --json /tmp/q$$.json >/dev/null
    python3 -c "import json;r=json.load(open('/tmp/q$$.json'))['result'];print('$r $o', round(r['throughput_mib_s']), round(r['latency_us']['p50']), round((r['cpu']['user_s']+r['cpu']['sys_s'])/(r['bytes']/1e9),2))"
  done
done
kill $T; wait $T 2>/dev/null
