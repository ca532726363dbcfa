#!/bin/sh
# Guest script (../shared/nvmevm run.sh --script) for tests/auth_linux.rs: Linux's nvmet with
# DH-HMAC-CHAP required, one host entry per test case, each with its own hash and DH group
# (dhchap_hash / dhchap_dhgroup), on 10.0.2.15 port 4420 (forward it with --hostfwd).
#   HOST_KEY   DHHC-1 host secret for every case but 9
#   HOST_KEY0  DHHC-1 host secret with transformation 00, case 9
#   CTRL_KEY   DHHC-1 controller secret of the bidirectional cases
#   SUBNQN     subsystem (default nqn.2026-11.org.example:ipsan-auth)
# Prints "NVMET ready" and serves for SERVE_SECONDS (default 300).
set -u
S=${SUBNQN:-nqn.2026-11.org.example:ipsan-auth} N=/sys/kernel/config/nvmet
P=nqn.2026-11.org.example:ipsan-auth-host
mkdir $N/subsystems/$S || { echo "RESULT fail no nvmet configfs"; exit 0; }
mkdir $N/subsystems/$S/namespaces/1
truncate -s 16M /tmp/ns.img
echo /tmp/ns.img >$N/subsystems/$S/namespaces/1/device_path; echo 1 >$N/subsystems/$S/namespaces/1/enable
# case hash dhgroup ctrl-key(0/1) host-key
for c in "1 hmac(sha256) null 0 $HOST_KEY" "2 hmac(sha256) ffdhe2048 1 $HOST_KEY" \
         "3 hmac(sha384) ffdhe3072 1 $HOST_KEY" "4 hmac(sha512) ffdhe4096 0 $HOST_KEY" \
         "5 hmac(sha384) ffdhe6144 0 $HOST_KEY" "6 hmac(sha512) ffdhe8192 1 $HOST_KEY" \
         "7 hmac(sha256) ffdhe2048 1 $HOST_KEY" "8 hmac(sha256) null 0 $HOST_KEY" \
         "9 hmac(sha256) ffdhe2048 0 $HOST_KEY0"; do
  set -- $c; H=$P$1
  mkdir $N/hosts/$H
  echo "$5" >$N/hosts/$H/dhchap_key || echo "RESULT fail host key refused for case $1"
  [ "$4" = 1 ] && { echo "$CTRL_KEY" >$N/hosts/$H/dhchap_ctrl_key || echo "RESULT fail ctrl key refused"; }
  echo "$2" >$N/hosts/$H/dhchap_hash || echo "RESULT fail hash $2 refused"
  echo "$3" >$N/hosts/$H/dhchap_dhgroup || echo "RESULT fail dhgroup $3 refused"
  ln -s $N/hosts/$H $N/subsystems/$S/allowed_hosts/$H
done
mkdir $N/ports/1; echo tcp >$N/ports/1/addr_trtype; echo ipv4 >$N/ports/1/addr_adrfam
echo 10.0.2.15 >$N/ports/1/addr_traddr; echo 4420 >$N/ports/1/addr_trsvcid
ln -s $N/subsystems/$S $N/ports/1/subsystems/$S
echo 8 >/proc/sys/kernel/printk
echo "NVMET ready subnqn=$S"
sleep "${SERVE_SECONDS:-300}"
echo "RESULT ok served"
