#!/bin/bash
# ab.sh OUTDIR REPS "label1 ENV=.. BIN" "label2 ENV=.. BIN" ... — alternated `qemu-img bench`
# runs against several ipsan targets started side by side (RAM LUN 1 GiB, each filled once):
# cells write 4KiB x32 (65536 commands) and write 64KiB x1 (20000 commands) by default
# (CELLS="rw/bs/depth/count ..."). Prints and appends JSON lines to OUTDIR/raw.jsonl.
set -e
D=$1; R=$2; shift 2
mkdir -p "$D"
CELLS=${CELLS:-"write/4096/32/65536 write/65536/1/20000"}
IQN=iqn.2026-11.org.ipsan:ab
free_port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
wait_port() { for i in $(seq 600); do python3 -c "import socket,sys;socket.create_connection(('127.0.0.1',$1),timeout=0.2).close()" 2>/dev/null && return 0; sleep 0.1; done; return 1; }
declare -a LABELS URLS PIDS
for spec in "$@"; do
  set -- $spec
  label=$1; shift
  port=$(free_port)
  env "$@" target --portal 127.0.0.1:$port --iqn $IQN --lun mem:1GiB > "$D/target-$label.log" 2>&1 &
  PIDS+=($!); LABELS+=($label); URLS+=(iscsi://127.0.0.1:$port/$IQN/0)
  wait_port $port
done
trap 'kill ${PIDS[@]} 2>/dev/null || true' EXIT
for u in "${URLS[@]}"; do /work/notes/bin/ipsan-s25base bench "$u" --rw write --bs 1MiB --depth 8 --size 1GiB --quiet >/dev/null; done
n=${#LABELS[@]}
for rep in $(seq 1 $R); do
  for cell in $CELLS; do
    IFS=/ read rw bs depth count <<< "$cell"
    for k in $(seq 0 $((n-1))); do
      i=$(( (k + rep) % n ))
      out=$(qemu-img bench -f raw -t none -c $count -d $depth -s $bs $([ $rw = write ] && echo -w) "${URLS[$i]}" 2>&1)
      secs=$(echo "$out" | sed -n 's/.*Run completed in \([0-9.]*\) seconds.*/\1/p')
      mib=$(python3 -c "print(round($count*$bs/$secs/2**20,1))")
      line="{\"rep\":$rep,\"cell\":\"$cell\",\"side\":\"${LABELS[$i]}\",\"mib_s\":$mib,\"load\":\"$(cut -d' ' -f1-3 /proc/loadavg)\"}"
      echo "$line" | tee -a "$D/raw.jsonl"
    done
  done
done
