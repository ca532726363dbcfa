#!/bin/bash
# 4 MiB reads, ipsan target vs tgtd bs_rbd on one image, same ipsan bench client, 6 s runs
# alternated 3x; then nstat around `rbd bench` alone (loopback retransmits/reordering).
# usage: run.sh IPSAN_BIN OUTDIR   (root; needs scripts/ceph-cluster's packages and tgt-rbd)
set -euo pipefail
B=$1; OUT=$2; ROOT=$(cd "$(dirname "$0")/../../../.." && pwd)
for port in 3300 3301; do ss -ltn | grep -q ":$port " && { echo "port $port is busy" >&2; exit 1; }; done
TP=; GP=
C=$(mktemp -d /tmp/ipsan-byhand.XXXXXX)
cleanup() { kill $TP 2>/dev/null || true; kill -9 $GP 2>/dev/null || true; sleep 1; "$ROOT/scripts/ceph-cluster" down $C/ceph >/dev/null 2>&1 || true; rm -f /var/run/tgtd/socket.17777*; }
trap cleanup EXIT
"$ROOT/scripts/ceph-cluster" up $C/ceph >/dev/null
export CEPH_CONF=$C/ceph/ceph.conf
rbd create --size 1G rbd/img0
$B target --portal 127.0.0.1:3300 --iqn iqn.2026-11.org.ipsan:r --ceph-conf $CEPH_CONF --lun rbd:rbd/img0,rbd_cache=false >$OUT/target.log 2>&1 & TP=$!
CEPH_ARGS="--rbd_cache=false" tgtd -f -C 17777 --iscsi portal=127.0.0.1:3301 >/dev/null 2>&1 & GP=$!
sleep 2
T="tgtadm -C 17777 --lld iscsi"
$T --mode target --op new --tid 1 --targetname iqn.2026-11.org.ipsan:t
$T --mode logicalunit --op new --tid 1 --lun 1 --bstype rbd --backing-store rbd/img0 --bsopts conf=$CEPH_CONF
$T --mode target --op bind --tid 1 --initiator-address ALL
for kv in InitialR2T=No ImmediateData=Yes MaxRecvDataSegmentLength=262144 MaxXmitDataSegmentLength=262144 FirstBurstLength=262144 MaxBurstLength=16776192 MaxOutstandingR2T=16; do
  $T --mode target --op update --tid 1 -n ${kv%%=*} -v ${kv#*=}; done
UI=iscsi://127.0.0.1:3300/iqn.2026-11.org.ipsan:r/0; UT=iscsi://127.0.0.1:3301/iqn.2026-11.org.ipsan:t/1
$B bench $UI --rw write --bs 4MiB --depth 16 --size 1GiB --quiet >/dev/null
cpu() { awk '{print $14+$15}' /proc/$1/stat; }
echo "loadavg start: $(cat /proc/loadavg)" > $OUT/runs.txt
for rep in 1 2 3; do for x in ipsan tgtd; do
  if [ $x = ipsan ]; then U=$UI; P=$TP; else U=$UT; P=$GP; fi
  c0=$(cpu $P); $B bench $U --rw read --bs 4MiB --depth 16 --time 6s --quiet --json $OUT/$x-$rep.json >/dev/null; c1=$(cpu $P)
  python3 -c "import json;r=json.load(open('$OUT/$x-$rep.json'))['result'];gb=r['bytes']/1e9;print('$x rep $rep', round(r['throughput_mib_s'],1), 'MiB/s  p50_ms', round(r['latency_us']['p50']/1000), 'p99_ms', round(r['latency_us']['p99']/1000), ' target_cpu_s_per_GB', round(($c1-$c0)/100/gb,3))" >> $OUT/runs.txt
done; done
echo "loadavg end: $(cat /proc/loadavg)" >> $OUT/runs.txt
nstat -n; rbd bench --io-type read --io-size 4M --io-threads 16 --io-total 1G --io-pattern seq rbd/img0 --rbd_cache=false > $OUT/rbd-bench.txt 2>&1; nstat > $OUT/nstat-rbd-bench.txt
