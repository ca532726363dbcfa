#!/usr/bin/env bash
# Runs tests/auth_linux.rs (this crate's HostAuth) against Linux's nvmet with DH-HMAC-CHAP in
# the nvmevm VM (../shared/nvmevm, built by its build.sh). One VM, ~1.5 GB RAM; port 44420 here
# (NA's range; override with PORT). Keys: tests/data/dhchap-keys.txt, made by nvme-cli.
# Exit status: the test's. Its output is appended to $OUT (default stdout only).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CRATE=$(cd "$HERE/../.." && pwd)
NVMEVM=${NVMEVM:-$(cd "$CRATE/../../.." && pwd)/shared/nvmevm}
[[ -x $NVMEVM/run.sh ]] || NVMEVM=/work/shared/nvmevm
PORT=${PORT:-44420}
KEYS=$CRATE/tests/data/dhchap-keys.txt
HOST_KEY=$(awk '$1=="random" && $2==1 {print $NF; exit}' "$KEYS")
HOST_KEY0=$(awk '$1=="random" && $2==0 {print $NF; exit}' "$KEYS")
CTRL_KEY=$(awk '$1=="random" && $2==3 {print $NF; exit}' "$KEYS")
SUBNQN=nqn.2026-11.org.example:ipsan-auth
LOG=$(mktemp /tmp/nvme-auth-vm.XXXXXX.log)
"$NVMEVM/run.sh" -q --script "$HERE/nvmet-auth-serve.sh" --hostfwd "$PORT:4420" --log "$LOG" \
  --env HOST_KEY="$HOST_KEY" --env HOST_KEY0="$HOST_KEY0" --env CTRL_KEY="$CTRL_KEY" \
  --env SUBNQN="$SUBNQN" --env SERVE_SECONDS=400 --timeout 600 &
VM=$!
trap 'kill $VM 2>/dev/null; wait $VM 2>/dev/null; rm -f "$LOG"' EXIT
for _ in $(seq 300); do
  grep -aq 'NVMET ready' "$LOG" 2>/dev/null && break
  grep -aq '^RESULT fail' "$LOG" 2>/dev/null && { grep -a RESULT "$LOG"; exit 1; }
  kill -0 $VM 2>/dev/null || { echo "the VM ended before serving"; tail -20 "$LOG"; exit 1; }
  sleep 1
done
grep -aq 'NVMET ready' "$LOG" || { echo "nvmet not ready after 300 s"; exit 1; }
set +e
(cd "$CRATE" && NVME_AUTH_LINUX_ADDR=127.0.0.1:$PORT NVME_AUTH_LINUX_SUBNQN=$SUBNQN \
  NVME_AUTH_HOST_KEY=$HOST_KEY NVME_AUTH_HOST_KEY0=$HOST_KEY0 NVME_AUTH_CTRL_KEY=$CTRL_KEY \
  cargo test -p nvme-proto --test auth_linux -- --ignored --nocapture 2>&1) | tee -a "${OUT:-/dev/null}"
rc=${PIPESTATUS[0]}
echo "--- guest kernel log (nvmet) ---"
grep -aE 'nvmet|nvme' "$LOG" | grep -av 'NVMEVM' | tail -40
exit "$rc"
