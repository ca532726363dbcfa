#!/bin/bash
# lat.sh BIN OUTDIR LABEL [SECS] [SESSION]
# ipsan bench 64 KiB x 1 reads against an ipsan target on loopback: latency (bench JSON) and
# per-process syscalls / context switches (perf stat on both processes).
set -e
B=$1; OUT=$2; L=$3; SECS=${4:-5s}; S=${5:-plain}
mkdir -p $OUT
TMP=$(mktemp -d)
python3 -c 'import os;print(os.urandom(32).hex())' > $TMP/key; chmod 600 $TMP/key
PORT=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
IQN=iqn.2026-11.org.ipsan:lat
$B target --portal 127.0.0.1:$PORT --iqn $IQN --lun mem:256MiB --seal-secret-file $TMP/key --crypto-workers 2 >$TMP/t.log 2>&1 &
TP=$!
sleep 1
URL=iscsi://127.0.0.1:$PORT/$IQN/0
$B bench $URL --rw write --bs 1MiB --depth 16 --size 256MiB --quiet >/dev/null
SEAL=""
[ "$S" != plain ] && SEAL="--seal $S --secret-file $TMP/key"
# 1: clean latency run
$B bench $URL --rw read --bs 64KiB --depth 1 --time $SECS --quiet $SEAL --json $OUT/lat-$L.json >/dev/null
# 2: counted run
perf stat -e raw_syscalls:sys_enter,context-switches,cpu-migrations -p $TP -o $OUT/perfstat-target-$L.txt &
PP=$!
sleep 0.2
perf stat -e raw_syscalls:sys_enter,context-switches,cpu-migrations -o $OUT/perfstat-bench-$L.txt -- \
  $B bench $URL --rw read --bs 64KiB --depth 1 --time $SECS --quiet $SEAL --json $OUT/lat-counted-$L.json >/dev/null
kill -INT $PP; wait $PP || true
kill $TP; wait $TP || true
rm -rf $TMP
python3 - $OUT $L <<'PY'
import json,sys,re
out,l=sys.argv[1],sys.argv[2]
j=json.load(open(f"{out}/lat-{l}.json"))["result"]
lat=j["latency_us"]
c=json.load(open(f"{out}/lat-counted-{l}.json"))["result"]
ops=c.get("ops") or c.get("commands") or round(c["bytes"]/65536)
def stat(f):
    d={}
    for line in open(f):
        m=re.match(r"\s*([\d,]+)\s+(\S+)",line)
        if m: d[m.group(2)]=int(m.group(1).replace(",",""))
    return d
t=stat(f"{out}/perfstat-target-{l}.txt"); b=stat(f"{out}/perfstat-bench-{l}.txt")
print(f"{l}: p50 {lat['p50']:.1f} us p99 {lat['p99']:.1f} mean {lat['mean']:.1f} ({lat['samples']} cmds); per command: "
      f"target syscalls {t.get('raw_syscalls:sys_enter',0)/ops:.2f} cs {t.get('context-switches',0)/ops:.2f}; "
      f"bench syscalls {b.get('raw_syscalls:sys_enter',0)/ops:.2f} cs {b.get('context-switches',0)/ops:.2f} ({ops} cmds counted)")
PY
