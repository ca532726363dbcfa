#!/bin/sh
# Guest script (../shared/nvmevm/run.sh --script) for run.sh here: Linux 6.12's host (nvme-cli
# 2.13) against an ipsan target on this machine's 127.0.0.1:PORT (10.0.2.2 in the guest) whose
# discovery controller authenticates and whose DH-HMAC-CHAP secrets are per subsystem.
#   PORT, SUB_A, SUB_B, DISC_KEY (the host's secret for discovery), A_KEY (for SUB_A),
#   WRONG_KEY (a secret the target does not have)
# Prints one CASE line per attempt (exit code, output, what `nvme discover` listed), the
# kernel's log, then RESULT ok (the verdicts are run.sh's).
set -u
A=10.0.2.2 H=$(cat /etc/nvme/hostnqn)
d="-t tcp -a $A -s $PORT -q $H"
case_() { name=$1; shift; "$@" >/tmp/out 2>&1; rc=$?
  echo "CASE $name rc=$rc subnqns=[$(grep -o 'subnqn: *[^ ]*' /tmp/out | sed 's/subnqn: *//' | tr '\n' ' ')] $(tr '\n' ' ' </tmp/out | cut -c1-300)"; }
case_ discover-no-secret nvme discover $d
case_ discover-wrong-secret nvme discover $d --dhchap-secret="$WRONG_KEY"
case_ discover-a-secret nvme discover $d --dhchap-secret="$A_KEY"
case_ discover-disc-secret nvme discover $d --dhchap-secret="$DISC_KEY"
# The kernel's host itself, given the key: a discovery controller by hand, its log read.
opts="transport=tcp,traddr=$A,trsvcid=$PORT,nqn=nqn.2014-08.org.nvmexpress.discovery,hostnqn=$H,hostid=$(cat /etc/nvme/hostid)"
for k in DISC_KEY WRONG_KEY; do
  eval key=\$$k
  r=$(echo "$opts,dhchap_secret=$key" 2>/tmp/err >/dev/nvme-fabrics && echo ok || echo "refused $(cat /tmp/err)")
  c=$(ls /sys/class/nvme/ 2>/dev/null | tr '\n' ' ')
  echo "CASE kernel-discovery-$k write=$r controllers=[$c]"
  for n in $(ls /sys/class/nvme/ 2>/dev/null); do
    if [ "$(cat /sys/class/nvme/$n/subsysnqn)" = nqn.2014-08.org.nvmexpress.discovery ]; then
      case_ kernel-discovery-$k-log nvme discover -d $n
      echo 1 >/sys/class/nvme/$n/delete_controller 2>/dev/null
    fi
  done
done
case_ connect-b-with-a-secret nvme connect $d -n "$SUB_B" --dhchap-secret="$A_KEY"
case_ connect-a-with-disc-secret nvme connect $d -n "$SUB_A" --dhchap-secret="$DISC_KEY"
case_ connect-a-with-a-secret nvme connect $d -n "$SUB_A" --dhchap-secret="$A_KEY"
i=0; while [ ! -b /dev/nvme0n1 ] && [ $i -lt 50 ]; do sleep 0.2; i=$((i + 1)); done
[ -b /dev/nvme0n1 ] && echo "CASE a-namespace rc=0 $(cat /sys/block/nvme0n1/size) sectors" ||
  echo "CASE a-namespace rc=1 no /dev/nvme0n1"
case_ disconnect-a nvme disconnect -n "$SUB_A"
dmesg | grep -iE 'nvme|auth' | sed 's/^/KERNEL /' | tail -40
echo "RESULT ok"
