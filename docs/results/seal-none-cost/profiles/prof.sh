#!/bin/bash
# prof.sh BIN OUTDIR SESSION RW [BS] [DEPTH] [SIZE]
# Profiles one ipsan bench run against one ipsan target (perf record on both).
set -e
B=$1; OUT=$2; S=$3; RW=$4; BS=${5:-1MiB}; DEPTH=${6:-16}; SIZE=${7:-2GiB}
mkdir -p $OUT
TMP=$(mktemp -d)
python3 -c 'import os;print(os.urandom(32).hex())' > $TMP/key; chmod 600 $TMP/key
PORT=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
IQN=iqn.2026-11.org.ipsan:prof
$B target --portal 127.0.0.1:$PORT --iqn $IQN --lun mem:256MiB --seal-secret-file $TMP/key --crypto-workers 2 >$TMP/t.log 2>&1 &
TP=$!
sleep 1
URL=iscsi://127.0.0.1:$PORT/$IQN/0
$B bench $URL --rw write --bs 1MiB --depth 16 --size 256MiB --quiet >/dev/null
SEAL=""
[ "$S" != plain ] && SEAL="--seal $S --secret-file $TMP/key --crypto-workers 2"
perf record -F 1999 -g -p $TP -o $OUT/target-$S-$RW.data 2>/dev/null &
PP=$!
sleep 0.3
perf record -F 1999 -g -o $OUT/bench-$S-$RW.data -- $B bench $URL --rw $RW --bs $BS --depth $DEPTH --size $SIZE --threads 2 --quiet $SEAL --json $OUT/bench-$S-$RW.json > /dev/null 2>&1
kill -INT $PP; wait $PP || true
kill $TP; wait $TP || true
rm -rf $TMP
python3 -c "import json;j=json.load(open('$OUT/bench-$S-$RW.json'))['result'];print('$S $RW', j['throughput_mib_s'], j['cpu'])"
