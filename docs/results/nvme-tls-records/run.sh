#!/usr/bin/env bash
# New build against old, alternated rep by rep (scripts/bench nvme --bin-b), plain NVMe/TCP and
# NVMe/TCP + TLS, with the cipher's own speed measured at the start and the end:
#   docs/results/nvme-tls-records/run.sh NEW_IPSAN OLD_IPSAN OUT [REPS] [SIDES]
# OUT gets openssl-speed-{start,end}.txt, bench/ (scripts/bench nvme's directory) and extra.md
# (extra.py: TLS's extra CPU over plain per side and build, against the cipher).
set -euo pipefail
new=$1 old=$2 out=$3 reps=${4:-3} sides=${5:-nvme,nvme-tls}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
mkdir -p "$out"
openssl speed -evp aes-128-gcm -bytes 16384 -seconds 3 > "$out/openssl-speed-start.txt" 2>&1
"$root/scripts/bench" nvme --bin "$new" --bin-b "$old" --sides "$sides" --reps "$reps" --secs 3 \
  --size 256MiB --out "$out/bench" > /dev/null
openssl speed -evp aes-128-gcm -bytes 16384 -seconds 3 > "$out/openssl-speed-end.txt" 2>&1
python3 "$here/extra.py" "$out/bench" "$out/openssl-speed-start.txt" "$out/openssl-speed-end.txt" \
  > "$out/extra.md"
