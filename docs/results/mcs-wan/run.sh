#!/bin/bash
# Several connections per session (issue 28, docs/wan.md): sealed writes and reads through
# `ipsan wan` at 100 Mbit/s, 16 ms one way, 1 % loss each way, with `ipsan bench
# --connections 1` vs `--connections 4 --spread least-bytes` vs `--connections 4 --spread
# round-robin`, alternated (the order rotates each rep), REPS reps; congestion control $CC
# (default cubic) on both ends, run size $SIZE (default 16MiB).
#
#   docs/results/mcs-wan/run.sh BIN OUT [REPS]
#
# BIN: a release `ipsan`; needs root (namespaces).
set -euo pipefail
bin=$(readlink -f "$1"); out=$(readlink -f "$2"); reps=${3:-3}
name=mcsw; net=10.231.78; tgt=$net.2; iqn=iqn.2026-11.org.ipsan:mcs
delay=${DELAY:-16ms}; rate=${RATE:-100mbit}; loss=${LOSS:-1%}; size=${SIZE:-16MiB}; cc=${CC:-cubic}
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
"$bin" wan up --name "$name" --subnet "$net.0/24" --delay "$delay" --rate "$rate" --loss "$loss" >"$out/link.txt"
ip netns exec "$name-tgt" "$bin" target --portal "$tgt:3260" --iqn "$iqn" --lun mem:64MiB \
  --seal required --seal-secret-file "$work/key" --tcp-congestion "$cc" >"$work/t.out" 2>"$out/target.log" &
tgt_pid=$!; pids+=("$tgt_pid")
for _ in $(seq 300); do grep -q "listening on" "$work/t.out" && break; sleep 0.1; done
grep -q "listening on" "$work/t.out"
{
  echo "machine: $(nproc) vCPUs, $(uname -r), $(date -u +%FT%TZ), binary sha256 $(sha256sum "$bin" | cut -c1-12)"
  echo "link: ipsan wan up --name $name --subnet $net.0/24 --delay $delay --rate $rate --loss $loss"
  echo "tcp: --tcp-congestion $cc on the target and the bench"
  echo "target: ipsan target --lun mem:64MiB --seal required (one process for every run; connections_per_session 4, the default)"
  echo "bench: ipsan bench --rw write|read --bs 256KiB --depth 16 --command-timeout 0 --size $size --seal aes-256-gcm --connections 1|4 [--spread least-bytes|round-robin] (reads with --verify)"
  echo "load at start: $(cat /proc/loadavg)"
} >"$out/machine.txt"
: >"$out/raw.jsonl"
tck=$(getconf CLK_TCK)
cpu_of() { awk -v t="$tck" '{ printf "%.2f", ($14 + $15) / t }' "/proc/$1/stat"; }
url="iscsi://$tgt:3260/$iqn/0"
confs=(c1 c4-least-bytes c4-round-robin)
for rep in $(seq 0 $((reps - 1))); do
  for i in 0 1 2; do
    conf=${confs[$(( (i + rep) % 3 ))]}
    case $conf in
      c1) c=(--connections 1) ;;
      c4-least-bytes) c=(--connections 4 --spread least-bytes) ;;
      c4-round-robin) c=(--connections 4 --spread round-robin) ;;
    esac
    for rw in write read; do
      v=(--verify)  # writes write the pattern, reads check it
      load=$(cut -d' ' -f1-3 /proc/loadavg)
      run="$conf-$rw-$rep"
      t0=$(cpu_of "$tgt_pid")
      ip netns exec "$name-ini" "$bin" bench "$url" --rw "$rw" --bs 256KiB --depth 16 --command-timeout 0 \
        --size "$size" --seal aes-256-gcm --secret-file "$work/key" --recovery-timeout 0 --tcp-congestion "$cc" \
        "${c[@]}" "${v[@]}" --quiet --json "$out/$run.json" >"$out/$run.txt" 2>"$out/$run.err"
      t1=$(cpu_of "$tgt_pid")
      python3 - "$out/$run.json" "$conf" "$rw" "$rep" "$load" "$t0" "$t1" >>"$out/raw.jsonl" <<'PY'
import json, sys
a = sys.argv
r = json.load(open(a[1]))["result"]
print(json.dumps({"conf": a[2], "rw": a[3], "rep": int(a[4]), "loadavg_before": a[5],
                  "mb_s": r["throughput_mb_s"], "bytes": r["bytes"],
                  "bench_cpu_s": round(r["cpu"]["user_s"] + r["cpu"]["sys_s"], 3),
                  "target_cpu_s": round(float(a[7]) - float(a[6]), 2),
                  "verified_blocks": r["verify"]["checked_blocks"]}))
PY
    done
  done
done
echo "load at end: $(cat /proc/loadavg)" >>"$out/machine.txt"
python3 "$(dirname "$0")/summarize.py" "$out/raw.jsonl" >"$out/summary.md"
cat "$out/summary.md"
