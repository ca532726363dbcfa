#!/usr/bin/env bash
# ipsan's own host (`ipsan discover`, NEW) against the old target (OLD: main's code at the
# start of session 19, /work/notes/bin/ipsan-s18b) and the new one (NEW), same config: one host
# with a DH-HMAC-CHAP secret for every subsystem. Four attempts per target: an unknown host, the
# keyed host without a secret, with a wrong one, with its own.
#   OLD=... NEW=... ab.sh
set -u
OLD=${OLD:-/work/notes/bin/ipsan-s18b} NEW=${NEW:-${CARGO_TARGET_DIR:-target}/debug/ipsan}
dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT; cd "$dir"; umask 077
key() { python3 -c 'import base64,sys,zlib; k=bytes([int(sys.argv[1],16)])*32; print("DHHC-1:00:"+base64.b64encode(k+zlib.crc32(k).to_bytes(4,"little")).decode()+":")' "$1"; }
key 61 >g.dhchap; key 77 >wrong.dhchap
G=nqn.2014-08.org.nvmexpress:uuid:06060606-0000-4000-8000-000000000006
X=nqn.2014-08.org.nvmexpress:uuid:0e0e0e0e-0000-4000-8000-00000000000e
printf '[server]\nportals = ["127.0.0.1:0"]\n[nvme]\nlisten = ["127.0.0.1:0"]\n[[nvme.host]]\nnqn = "%s"\ndhchap_secret_file = "%s/g.dhchap"\n[[target]]\niqn = "iqn.2026-11.org.ipsan:ab"\n[[target.lun]]\nid = 0\nbackend = "mem:4MiB"\n' "$G" "$dir" >t.toml
for bin in "$OLD" "$NEW"; do
  "$bin" target --config t.toml >t.log 2>&1 & pid=$!
  for _ in $(seq 100); do grep -q '(NVMe/TCP)' t.log && break; sleep 0.1; done
  port=$(sed -n 's/.*listening on [0-9.]*:\([0-9]*\) (NVMe\/TCP).*/\1/p' t.log | head -1)
  echo "== target $bin"
  for who in "$X none" "$G none" "$G wrong.dhchap" "$G g.dhchap"; do
    set -- $who; extra=(); [[ $2 != none ]] && extra=(--dhchap-secret-file "$2")
    out=$(timeout 20 "$NEW" discover "nvme+tcp://127.0.0.1:$port" --hostnqn "$1" "${extra[@]}" 2>&1); rc=$?
    echo "host ${1##*:} secret=$2 rc=$rc log_entries_for_the_subsystem=$(grep -c 'ipsan:ab' <<<"$out") :: $(tail -1 <<<"$out" | cut -c1-160)"
  done
  kill $pid; wait $pid 2>/dev/null
done
