#!/bin/bash
# Full iscsi-test-cu (ALL) on an RBD and a file LUN of one ipsan target (as recorded for docs/rbd.md).
set -u
cd /work/wt/rbd
W=/var/tmp/fullcu; rm -rf $W; mkdir -p $W
out=$W/out; mkdir -p $out
CEPH_OSD_SIZE=4G scripts/ceph-cluster up $W/ceph > $out/ceph-up.log 2>&1 || { cat $out/ceph-up.log; exit 1; }
rbd -c $W/ceph/ceph.conf create rbd/cu --size 256M 2>/dev/null
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
iqn=iqn.2026-11.org.ipsan:cu
target/debug/ipsan target --portal 127.0.0.1:$port --iqn $iqn --lun "rbd:rbd/cu,conf=$W/ceph/ceph.conf" --lun "file:$W/file.img,size=256MiB" > $out/target.log 2>&1 &
tp=$!
sleep 3
echo "start $(date -u +%FT%TZ) load $(cut -d' ' -f1-3 /proc/loadavg) rev $(git rev-parse --short HEAD)" > $out/meta.txt
timeout 1200 iscsi-test-cu --dataloss --test=ALL iscsi://127.0.0.1:$port/$iqn/0 > $out/conformance-rbd.log 2>&1
echo "rbd done $(date -u +%FT%TZ) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $out/meta.txt
timeout 1200 iscsi-test-cu --dataloss --test=ALL iscsi://127.0.0.1:$port/$iqn/1 > $out/conformance-file.log 2>&1
echo "file done $(date -u +%FT%TZ) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $out/meta.txt
kill $tp; wait $tp
python3 scripts/cu-summary.py $out/conformance-rbd.log --json > $out/conformance-rbd.json
python3 scripts/cu-summary.py $out/conformance-file.log --json > $out/conformance-file.json
scripts/ceph-cluster down $W/ceph > /dev/null 2>&1
echo FINISHED >> $out/meta.txt
