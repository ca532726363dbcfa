#!/usr/bin/env bash
# Linux 6.12's host against ipsan's authenticating discovery controller and per-subsystem
# DH-HMAC-CHAP secrets (docs/nvme.md "DH-HMAC-CHAP"): starts `ipsan target` ($IPSAN_BIN) on a
# free loopback port with two subsystems, host secrets for subsystem A and for discovery
# only, boots ../shared/nvmevm once with guest.sh, and prints the guest's CASE lines.
#   run.sh [OUT-FILE]    (needs ../shared/nvmevm built; ~1-2 min)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../../.." && pwd)
bin=${IPSAN_BIN:-${CARGO_TARGET_DIR:-$repo/target}/debug/ipsan}
vm=${NVMEVM:-$repo/../shared/nvmevm}
out=${1:-/dev/stdout}
tmp=$(mktemp -d); trap 'kill $pid 2>/dev/null || true; rm -rf "$tmp"' EXIT
host=nqn.2014-08.org.nvmexpress:uuid:6e766d65-766d-4000-8000-000000000001
key() { python3 -c 'import base64,sys,zlib; k=bytes([int(sys.argv[1],16)])*32; print("DHHC-1:00:"+base64.b64encode(k+zlib.crc32(k).to_bytes(4,"little")).decode()+":")' "$1"; }
disc=$(key d1) a=$(key a1) wrong=$(key ee)
umask 077; echo "$disc" >"$tmp/disc"; echo "$a" >"$tmp/a"
cat >"$tmp/ipsan.toml" <<TOML
[server]
portals = ["127.0.0.1:0"]
[nvme]
listen = ["127.0.0.1:0"]
[[nvme.host]]
nqn = "$host"
dhchap_secret_file = "$tmp/disc"
subsystems = ["nqn.2014-08.org.nvmexpress.discovery"]
[[nvme.host]]
nqn = "$host"
dhchap_secret_file = "$tmp/a"
subsystems = ["iqn.2026-11.org.ipsan:disc-a"]
[[target]]
iqn = "iqn.2026-11.org.ipsan:disc-a"
[[target.lun]]
id = 0
backend = "mem:64MiB"
[[target]]
iqn = "iqn.2026-11.org.ipsan:disc-b"
[[target.lun]]
id = 0
backend = "mem:64MiB"
TOML
"$bin" target --config "$tmp/ipsan.toml" >"$tmp/target.log" 2>&1 & pid=$!
for _ in $(seq 100); do grep -q 'listening on .*(NVMe/TCP)' "$tmp/target.log" && break; sleep 0.1; done
port=$(sed -n 's/.*listening on [0-9.]*:\([0-9]*\) (NVMe\/TCP).*/\1/p' "$tmp/target.log" | head -1)
[[ -n $port ]] || { cat "$tmp/target.log"; exit 1; }
"$vm/run.sh" --script "$here/guest.sh" --env PORT="$port" \
  --env SUB_A=nqn.2026-11.org.ipsan:disc-a --env SUB_B=nqn.2026-11.org.ipsan:disc-b \
  --env DISC_KEY="$disc" --env A_KEY="$a" --env WRONG_KEY="$wrong" --timeout 300 >"$tmp/vm.log" 2>&1 || true
{ grep -E '^(CASE|KERNEL|RESULT)' "$tmp/vm.log" || cat "$tmp/vm.log"; echo "--- target log"; grep -v '^$' "$tmp/target.log" | tail -40; } >"$out"
