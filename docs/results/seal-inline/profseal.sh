#!/bin/bash
# usage: profseal.sh BIN PORT TAG RW
BIN=$1; PORT=$2; TAG=$3; RW=${4:-read}
IQN=iqn.2026-11.org.ipsan:cell
KEY=/tmp/eng/seal.key
[ -f $KEY ] || { head -c 32 /dev/urandom | xxd -p -c 64 > $KEY; chmod 600 $KEY; }
$BIN target --portal 127.0.0.1:$PORT --iqn $IQN --lun mem:1GiB --seal-secret-file $KEY --crypto-workers 2 >/tmp/eng/t-$PORT.log 2>&1 &
TP=$!
sleep 1
URL=iscsi://127.0.0.1:$PORT/$IQN/0
$BIN bench $URL --rw write --bs 1MiB --depth 16 --size 1GiB --quiet >/dev/null
perf record -F 2000 -g -o /tmp/eng/p-tgt-$TAG.data -p $TP 2>/dev/null &
PP=$!
perf record -F 2000 -g -o /tmp/eng/p-ini-$TAG.data -- $BIN bench $URL --rw $RW --bs 4KiB --depth 32 --size 512MiB --quiet --json /tmp/eng/r-$TAG.json --threads 2 --seal aes-256-gcm --secret-file $KEY --crypto-workers 2 >/dev/null 2>&1
kill -INT $PP; wait $PP
python3 -c "import json;r=json.load(open('/tmp/eng/r-$TAG.json'))['result'];print('$TAG', r['throughput_mib_s'], r['cpu'])"
kill $TP; wait $TP 2>/dev/null
