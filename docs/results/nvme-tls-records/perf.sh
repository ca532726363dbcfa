#!/usr/bin/env bash
# Where TLS's CPU goes on both sides of one `ipsan bench` cell over NVMe/TCP + TLS (or plain):
#   docs/results/nvme-tls-records/perf.sh IPSAN OUT RW BS DEPTH [tls|plain] [SECS]
# Starts `ipsan target` (256 MiB RAM LUN, TLS allowed with a fresh PSK, as scripts/bench nvme
# does), fills the LUN once over iSCSI (as scripts/bench nvme does: no first-touch page faults
# in the profile), runs `ipsan bench` on 2 queues under `perf record -g`, with `perf record -g -p` on the
# target for the same time, and writes OUT/{client,target}.txt: the bench's line, then
# `perf report` by shared object and by symbol (top entries).
set -euo pipefail
bin=$1 out=$2 rw=$3 bs=$4 depth=$5 mode=${6:-tls} secs=${7:-4}
hostnqn=nqn.2014-08.org.nvmexpress:uuid:6e766d65-6265-6e63-6800-000000000001
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'kill $tpid 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$tmp"' EXIT
python3 - "$tmp/key" <<'PY'
import base64, os, secrets, sys, zlib
k = secrets.token_bytes(32)
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT, 0o600)
os.write(fd, ("NVMeTLSkey-1:01:" + base64.b64encode(k + zlib.crc32(k).to_bytes(4, "little")).decode() + ":\n").encode())
PY
"$bin" target --portal 127.0.0.1:0 --iqn iqn.2026-11.org.ipsan:perf --lun mem:256MiB \
  --nvme-listen 127.0.0.1:0 --nvme-tls-key "$hostnqn,$tmp/key" --nvme-tls allowed > "$tmp/target.log" 2>&1 &
tpid=$!
for _ in $(seq 100); do grep -q 'serving nvme+tcp://' "$tmp/target.log" && break; sleep 0.2; done
url=$(grep -o 'nvme+tcp://[^ ]*' "$tmp/target.log" | head -1)
iscsi=$(grep -o 'iscsi://[^ ]*' "$tmp/target.log" | head -1)
"$bin" bench "$iscsi" --rw write --bs 1MiB --depth 8 --size 256MiB --quiet > /dev/null
extra=(--queues 2)
[[ $mode == tls ]] && extra+=(--hostnqn "$hostnqn" --tls-key-file "$tmp/key")
echo "$(date -u +%FT%TZ) load $(cat /proc/loadavg)" > "$out/when.txt"
perf record -g -o "$tmp/target.data" -p "$tpid" -- sleep $((secs + 2)) 2> /dev/null &
ppid=$!
sleep 0.5
perf record -g -o "$tmp/client.data" -- "$bin" bench "$url" --rw "$rw" --bs "$bs" --depth "$depth" \
  --time "${secs}s" --quiet --json "$tmp/bench.json" "${extra[@]}" > /dev/null 2>&1
wait $ppid || true
python3 - "$tmp/bench.json" > "$tmp/bench.txt" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))["result"]
cpu = r["cpu"]["user_s"] + r["cpu"]["sys_s"]
print("bench: %.0f MiB/s, client %.2f CPU-s/GB (under perf)" % (r["throughput_mib_s"], cpu / (r["bytes"] / 1e9)))
PY
for side in client target; do
  {
    echo "# $rw $bs x $depth, $mode, $(cat "$out/when.txt")"
    cat "$tmp/bench.txt"
    echo "## perf report --no-children --sort dso"
    perf report -i "$tmp/$side.data" --no-children --sort dso --stdio -g none 2> /dev/null | grep -v '^#' | grep -v '^$' | head -12 || true
    echo "## perf report --no-children --sort dso,sym (top 25)"
    perf report -i "$tmp/$side.data" --no-children --sort dso,sym --stdio -g none 2> /dev/null | grep -v '^#' | grep -v '^$' | head -25 || true
  } > "$out/$side.txt"
done
