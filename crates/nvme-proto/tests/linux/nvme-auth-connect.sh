#!/bin/sh
# Guest script (../shared/nvmevm run.sh --script) for tests/auth_linux_host.rs: Linux's host
# runs `nvme connect` with DH-HMAC-CHAP against the test's controller on this machine's
# 127.0.0.1:PORT (10.0.2.2 here), once per case; the test checks the outcomes on its side,
# this prints the kernel's view of each. The connections end after authentication (the
# test's target refuses every other command), so `nvme connect` itself fails: expected.
#   PORT, SUBNQN, HOST_KEY, HOST_KEY0, CTRL_KEY (DHHC-1 secrets)
set -u
P=nqn.2026-11.org.example:ipsan-auth-linuxhost
# case host-key with-ctrl-key
for c in "1 $HOST_KEY 0" "2 $HOST_KEY 1" "3 $HOST_KEY 1" "4 $HOST_KEY 0" "5 $HOST_KEY 1" \
         "6 $HOST_KEY 1" "7 $HOST_KEY 0" "8 $HOST_KEY 1" "9 $HOST_KEY0 0"; do
  set -- $c
  if [ "$3" = 1 ]; then
    nvme connect -t tcp -a 10.0.2.2 -s "$PORT" -n "$SUBNQN" --hostnqn="$P$1" \
      --dhchap-secret="$2" --dhchap-ctrl-secret="$CTRL_KEY" >/tmp/connect.out 2>&1
  else
    nvme connect -t tcp -a 10.0.2.2 -s "$PORT" -n "$SUBNQN" --hostnqn="$P$1" \
      --dhchap-secret="$2" >/tmp/connect.out 2>&1
  fi
  echo "CASE $1 nvme connect rc=$? $(tr '\n' ' ' </tmp/connect.out)"
done
dmesg | grep -E 'nvme|auth' | sed 's/^/KERNEL /'
echo "RESULT ok"
