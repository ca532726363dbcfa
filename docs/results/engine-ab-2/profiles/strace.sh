#!/bin/bash
BIN=$1; PORT=$2
IQN=iqn.2026-11.org.ipsan:cell
$BIN target --portal 127.0.0.1:$PORT --iqn $IQN --lun mem:1GiB >/tmp/eng/t-$PORT.log 2>&1 &
TP=$!
sleep 1
URL=iscsi://127.0.0.1:$PORT/$IQN/0
$BIN bench $URL --rw write --bs 1MiB --depth 16 --size 64MiB --quiet >/dev/null
strace -c -f -p $TP -o /tmp/eng/strace-tgt-$PORT.txt &
SP=$!
sleep 1
strace -c -f -o /tmp/eng/strace-ini-$PORT.txt $BIN bench $URL --rw read --bs 64KiB --depth 1 --size 64MiB --quiet >/dev/null 2>&1
kill -INT $SP; wait $SP
kill $TP; wait $TP 2>/dev/null
echo "== $BIN target"; head -14 /tmp/eng/strace-tgt-$PORT.txt
echo "== $BIN initiator"; head -14 /tmp/eng/strace-ini-$PORT.txt
