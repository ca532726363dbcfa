#!/bin/bash
# The profiling runs behind summary.md (ad hoc, kept for provenance; not a benchmark).
# usage: profile.sh BIN RW BS TAG [",librbd_option=value" appended to the LUN]
# Needs a cluster from `scripts/ceph-cluster up /var/tmp/rbd2-ceph` with a 1 GiB image rbd/prof
# written end to end (`rbd bench --io-type write --io-size 4M ... rbd/prof`). Starts BIN's
# target on it, warms up with 256 MiB, then records `perf record -F 999 -g` of the target process
# over 1 GiB of `BIN bench` (16 in flight) and prints MiB/s and the target's CPU-s/GB.
# profile-categories.py PERF.DATA... groups `perf report` symbols into the categories of
# profile-categories.txt.
BIN=$1; RW=$2; BS=$3; TAG=$4; OPTS=${5:-}
C=/var/tmp/rbd2-ceph/ceph.conf
IQN=iqn.2026-11.org.ipsan:prof
$BIN target --portal 127.0.0.1:0 --iqn $IQN --ceph-conf $C --lun "rbd:rbd/prof,rbd_cache=false$OPTS" > /tmp/rbd2prof/t-$TAG.log 2>&1 &
TP=$!
for i in $(seq 100); do grep -q "listening on" /tmp/rbd2prof/t-$TAG.log && break; sleep 0.2; done
ADDR=$(grep -o "listening on [^ ]*" /tmp/rbd2prof/t-$TAG.log | awk '{print $3}')
URL=iscsi://$ADDR/$IQN/0
# warm up
$BIN bench $URL --rw $RW --bs $BS --depth 16 --size 256MiB --quiet >/dev/null
c0=$(awk '{print $14+$15}' /proc/$TP/stat)
perf record -F 999 -g -p $TP -o /tmp/rbd2prof/perf-$TAG.data 2>/dev/null &
PP=$!
sleep 0.5
$BIN bench $URL --rw $RW --bs $BS --depth 16 --size 1GiB --quiet --json /tmp/rbd2prof/b-$TAG.json >/dev/null
c1=$(awk '{print $14+$15}' /proc/$TP/stat)
kill -INT $PP; wait $PP
kill $TP; wait $TP
python3 -c "import json;r=json.load(open('/tmp/rbd2prof/b-$TAG.json'))['result'];print('$TAG', round(r['throughput_mib_s']), 'MiB/s', ($c1-$c0)/100/(r['bytes']/1e9), 'CPU-s/GB')"
cat /proc/loadavg
