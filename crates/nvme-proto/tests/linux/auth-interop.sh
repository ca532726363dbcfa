#!/usr/bin/env bash
# DH-HMAC-CHAP against Linux 6.12 in the nvmevm VM (../shared/nvmevm, built by its build.sh),
# one VM at a time (~1.5 GB RAM), ports 44420-44421 here (NA's range; PORT overrides the first):
#  1. tests/auth_linux.rs: this crate's HostAuth against Linux's nvmet (nvmet-auth-serve.sh);
#  2. tests/auth_linux_host.rs: this crate's ControllerAuth against Linux's host
#     (nvme-auth-connect.sh runs `nvme connect --dhchap-secret …` in the VM).
# Keys: tests/data/dhchap-keys.txt, made by nvme-cli. Exit status 0 when both pass; the tests'
# output is appended to $OUT (default: stdout only). `auth-interop.sh host` or `… controller`
# runs one part.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CRATE=$(cd "$HERE/../.." && pwd)
NVMEVM=${NVMEVM:-$(cd "$CRATE/../../.." && pwd)/shared/nvmevm}
[[ -x $NVMEVM/run.sh ]] || NVMEVM=/work/shared/nvmevm
PORT=${PORT:-44420}
PORT2=$((PORT + 1))
PART=${1:-both}
KEYS=$CRATE/tests/data/dhchap-keys.txt
HOST_KEY=$(awk '$1=="random" && $2==1 {print $NF; exit}' "$KEYS")
HOST_KEY0=$(awk '$1=="random" && $2==0 {print $NF; exit}' "$KEYS")
CTRL_KEY=$(awk '$1=="random" && $2==3 {print $NF; exit}' "$KEYS")
SUBNQN=nqn.2026-11.org.example:ipsan-auth
VMS=""
trap 'for p in $VMS; do kill "$p" 2>/dev/null || true; done' EXIT

host_side() {
  local LOG VM rc=0
  LOG=$(mktemp /tmp/nvme-auth-vm.XXXXXX.log)
  "$NVMEVM/run.sh" -q --script "$HERE/nvmet-auth-serve.sh" --hostfwd "$PORT:4420" --log "$LOG" \
    --env HOST_KEY="$HOST_KEY" --env HOST_KEY0="$HOST_KEY0" --env CTRL_KEY="$CTRL_KEY" \
    --env SUBNQN="$SUBNQN" --env SERVE_SECONDS=400 --timeout 600 &
  VM=$!; VMS="$VMS $VM"
  for _ in $(seq 300); do
    grep -aq 'NVMET ready' "$LOG" 2>/dev/null && break
    grep -aq '^RESULT fail' "$LOG" 2>/dev/null && break
    kill -0 $VM 2>/dev/null || break
    sleep 1
  done
  if grep -aq 'NVMET ready' "$LOG"; then
    (cd "$CRATE" && NVME_AUTH_LINUX_ADDR=127.0.0.1:$PORT NVME_AUTH_LINUX_SUBNQN=$SUBNQN \
      NVME_AUTH_HOST_KEY=$HOST_KEY NVME_AUTH_HOST_KEY0=$HOST_KEY0 NVME_AUTH_CTRL_KEY=$CTRL_KEY \
      cargo test -p nvme-proto --test auth_linux -- --ignored --nocapture 2>&1) \
      | tee -a "${OUT:-/dev/null}"
    rc=${PIPESTATUS[0]}
  else
    echo "nvmet did not start:"; grep -a RESULT "$LOG"; tail -20 "$LOG"; rc=1
  fi
  echo "--- guest kernel log (nvmet) ---" | tee -a "${OUT:-/dev/null}"
  grep -aE 'nvmet|nvme' "$LOG" | grep -av 'NVMEVM' | tail -40 | tee -a "${OUT:-/dev/null}"
  kill $VM 2>/dev/null || true; wait $VM 2>/dev/null || true
  rm -f "$LOG"
  return "$rc"
}

controller_side() {
  local LOG OUT2 T rc=0
  LOG=$(mktemp /tmp/nvme-auth-vm.XXXXXX.log) OUT2=$(mktemp /tmp/nvme-auth-test.XXXXXX.log)
  (cd "$CRATE" && cargo test -p nvme-proto --test auth_linux_host --no-run >/dev/null 2>&1)
  (cd "$CRATE" && NVME_AUTH_LISTEN=127.0.0.1:$PORT2 NVME_AUTH_LINUX_SUBNQN=$SUBNQN \
    NVME_AUTH_HOST_KEY=$HOST_KEY NVME_AUTH_HOST_KEY0=$HOST_KEY0 NVME_AUTH_CTRL_KEY=$CTRL_KEY \
    NVME_AUTH_WAIT_SECONDS=420 \
    exec cargo test -p nvme-proto --test auth_linux_host -- --ignored --nocapture) >"$OUT2" 2>&1 &
  T=$!; VMS="$VMS $T"
  for _ in $(seq 120); do grep -q 'listening on' "$OUT2" && break; sleep 1; done
  "$NVMEVM/run.sh" -q --script "$HERE/nvme-auth-connect.sh" --log "$LOG" --env PORT="$PORT2" \
    --env HOST_KEY="$HOST_KEY" --env HOST_KEY0="$HOST_KEY0" --env CTRL_KEY="$CTRL_KEY" \
    --env SUBNQN="$SUBNQN" --timeout 500 || echo "the VM's script did not finish"
  wait $T || rc=$?
  tee -a "${OUT:-/dev/null}" <"$OUT2"
  echo "--- guest: nvme connect and kernel log ---" | tee -a "${OUT:-/dev/null}"
  grep -aE '^(CASE|KERNEL)' "$LOG" | tee -a "${OUT:-/dev/null}"
  rm -f "$LOG" "$OUT2"
  return "$rc"
}

rc=0
case $PART in
  host) host_side || rc=$?;;
  controller) controller_side || rc=$?;;
  *) host_side || rc=$?; controller_side || rc=$?;;
esac
exit "$rc"
