#!/bin/bash
# Compression on the WAN leg (issue 28, docs/seal.md §4b, docs/wan.md *Compression*):
# effective throughput and CPU-s/GB of sealed writes and reads at 100 Mbit/s through
# `ipsan wan`, compression on vs off, three data sets, alternated, REPS reps.
#
#   docs/results/compression/run.sh BIN DATADIR OUT [REPS]
#
# BIN: a release `ipsan`; DATADIR: vm.img, src.img, random.img (make-data.sh); needs root.
set -euo pipefail
bin=$(readlink -f "$1"); data=$(readlink -f "$2"); out=$(readlink -f "$3"); reps=${4:-3}
name=cmpz; net=10.231.77; tgt=$net.2; iqn=iqn.2026-11.org.ipsan:compress
delay=8ms; rate=100mbit; size=${SIZE:-128MiB}
mkdir -p "$out"; work=$(mktemp -d); pids=()
cleanup() {
  set +e
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
  "$bin" wan down --name "$name" >/dev/null 2>&1
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 1' INT TERM
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$work/key"; chmod 600 "$work/key"
"$bin" wan up --name "$name" --subnet "$net.0/24" --delay "$delay" --rate "$rate" >"$out/link.txt"
ip netns exec "$name-tgt" "$bin" target --portal "$tgt:3260" --iqn "$iqn" --lun mem:160MiB \
  --seal required --seal-secret-file "$work/key" --compress >"$work/t.out" 2>"$out/target.log" &
tgt_pid=$!; pids+=("$tgt_pid")
for _ in $(seq 300); do grep -q "listening on" "$work/t.out" && break; sleep 0.1; done
grep -q "listening on" "$work/t.out"
{
  echo "machine: $(nproc) vCPUs, $(uname -r), $(date -u +%FT%TZ), binary sha256 $(sha256sum "$bin" | cut -c1-12)"
  echo "link: ipsan wan up --name $name --subnet $net.0/24 --delay $delay --rate $rate ($(head -1 "$out/link.txt"))"
  echo "target: ipsan target --lun mem:160MiB --seal required --compress (one process for every run)"
  echo "bench: ipsan bench --rw write|read --bs 1MiB --depth 16 --size $size --data-file D --seal aes-256-gcm [--compress] (reads with --verify)"
  echo "data: $(cd "$data" && sha256sum vm.img src.img random.img | cut -c1-12 | tr '\n' ' ')"
  echo "load at start: $(cat /proc/loadavg)"
} >"$out/machine.txt"
: >"$out/raw.jsonl"
tck=$(getconf CLK_TCK)
cpu_of() { awk -v t="$tck" '{ printf "%.2f", ($14 + $15) / t }' "/proc/$1/stat"; }
url="iscsi://$tgt:3260/$iqn/0"
for rep in $(seq 0 $((reps - 1))); do
  for ds in vm src random; do
    if [ $(( (rep + ${#ds}) % 2 )) = 0 ]; then order="on off"; else order="off on"; fi
    for mode in $order; do
      c=(); [ "$mode" = on ] && c=(--compress)
      for rw in write read; do
        v=(); [ "$rw" = read ] && v=(--verify)
        load=$(cut -d' ' -f1-3 /proc/loadavg)
        run="$ds-$mode-$rw-$rep"
        "$bin" wan stats --name "$name" --json >"$work/s0.json"
        t0=$(cpu_of "$tgt_pid")
        ip netns exec "$name-ini" "$bin" bench "$url" --rw "$rw" --bs 1MiB --depth 16 \
          --size "$size" --data-file "$data/$ds.img" --seal aes-256-gcm --secret-file "$work/key" \
          "${c[@]}" "${v[@]}" --quiet --json "$out/$run.json" >"$out/$run.txt"
        t1=$(cpu_of "$tgt_pid")
        "$bin" wan stats --name "$name" --json >"$work/s1.json"
        python3 - "$out/$run.json" "$ds" "$mode" "$rw" "$rep" "$load" "$t0" "$t1" \
          "$work/s0.json" "$work/s1.json" >>"$out/raw.jsonl" <<'PY'
import json, sys
a = sys.argv
r = json.load(open(a[1]))["result"]
s0, s1 = json.load(open(a[9])), json.load(open(a[10]))
def wire(d):
    return s1[d]["bytes_in"] - s0[d]["bytes_in"]
print(json.dumps({"data": a[2], "compress": a[3], "rw": a[4], "rep": int(a[5]),
                  "loadavg_before": a[6], "mb_s": r["throughput_mb_s"], "bytes": r["bytes"],
                  "bench_cpu_s": round(r["cpu"]["user_s"] + r["cpu"]["sys_s"], 3),
                  "target_cpu_s": round(float(a[8]) - float(a[7]), 2),
                  "wire_up_bytes": wire("up"), "wire_down_bytes": wire("down"),
                  "verified_blocks": r["verify"]["checked_blocks"]}))
PY
      done
    done
  done
done
echo "load at end: $(cat /proc/loadavg)" >>"$out/machine.txt"
python3 "$(dirname "$0")/summarize.py" "$out/raw.jsonl" >"$out/summary.md"
cat "$out/summary.md"
