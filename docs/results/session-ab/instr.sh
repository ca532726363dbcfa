#!/bin/bash
# instr.sh: instructions and task-clock of the client for 512 MiB of 4 KiB reads/writes at depth 32, base target
T=/tmp/ipsan-base
$T target --portal 127.0.0.1:3998 --iqn iqn.2026-11.org.ipsan:instr --lun mem:1GiB > /dev/null 2>&1 &
TP=$!
sleep 1
U=iscsi://127.0.0.1:3998/iqn.2026-11.org.ipsan:instr/0
$T bench $U --rw write --bs 1MiB --depth 16 --size 1GiB --quiet >/dev/null
for rep in 1 2 3; do
 for b in "$@"; do
  for rw in read write; do
   perf stat -x, -e instructions,task-clock,context-switches -o /tmp/ab2/stat.txt -- $b bench $U --rw $rw --bs 4KiB --depth 32 --size 512MiB --quiet --json /tmp/ab2/i.json >/dev/null 2>&1
   mib=$(python3 -c "import json;print(round(json.load(open('/tmp/ab2/i.json'))['result']['throughput_mib_s']))")
   echo "$(basename $b) $rw $mib MiB/s $(grep -v '^#' /tmp/ab2/stat.txt | grep . | awk -F, '{printf "%s=%s ", $3, $1}')"
  done
 done
done
kill $TP; wait $TP 2>/dev/null
