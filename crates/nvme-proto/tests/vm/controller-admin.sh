#!/bin/sh
# Guest script for ../shared/nvmevm (Linux 6.12, nvme-cli 2.13): nvme-cli's admin commands
# (id-ctrl, id-ns, ns-descs, list-ns, smart-log, fw-log, error-log, effects-log, get-feature),
# Compare (equal and different), Write Zeroes, DSM, reservations (resv-register, -acquire,
# -report, -release, unregister) and `nvme reset` against ipsan's NVMe
# controller (docs/nvme-controller.md). Settings: PORT, SUBNQN. Run from the repository:
#   ipsan target --portal 127.0.0.1:0 --iqn iqn.2026-11.org.ipsan:nctl --lun mem:256MiB \
#       --nvme-listen 127.0.0.1:64423 &
#   ../shared/nvmevm/run.sh --script crates/nvme-proto/tests/vm/controller-admin.sh \
#       --env PORT=64423 --env SUBNQN=nqn.2026-11.org.ipsan:nctl
set -u
A=10.0.2.2 H=$(cat /etc/nvme/hostnqn)
fail() { echo "RESULT fail $*"; dmesg | grep -i nvme | tail -15; exit 0; }
nvme connect -t tcp -a $A -s $PORT -n $SUBNQN -q $H -i 2 >/tmp/c.out 2>&1 || fail "connect: $(cat /tmp/c.out)"
i=0; while [ ! -b /dev/nvme0n1 ] && [ $i -lt 100 ]; do sleep 0.2; i=$((i + 1)); done
[ -b /dev/nvme0n1 ] || fail "no /dev/nvme0n1"
echo "== id-ctrl"; nvme id-ctrl /dev/nvme0 | grep -E "^(vid|sn|mn|fr|cntlid|ver|mdts|oncs|vwc|sgls|subnqn|ioccsz|iorcsz|kas|aerl|cntrltype|maxcmd|nn) " || fail "id-ctrl"
echo "== id-ns"; nvme id-ns /dev/nvme0n1 | grep -E "^(nsze|ncap|nuse|nmic|dlfeat|nguid|eui64)|lbaf  0" || fail "id-ns"
echo "== ns-descs"; nvme ns-descs /dev/nvme0n1 || fail "ns-descs"
echo "== list-ns"; nvme list-ns /dev/nvme0 || fail "list-ns"
echo "== smart-log"; nvme smart-log /dev/nvme0 | grep -iE "host_(read|write)_commands|data_units" || fail "smart-log"
echo "== fw-log"; nvme fw-log /dev/nvme0 || fail "fw-log"
echo "== error-log"; nvme error-log /dev/nvme0 -e 1 >/dev/null || fail "error-log"
echo "== effects-log"; nvme effects-log /dev/nvme0 | head -12 || fail "effects-log"
echo "== get-feature"; for f in 1 2 6 7 0xb 0xf; do nvme get-feature /dev/nvme0 -f $f || fail "get-feature $f"; done
echo "== compare"; dd if=/dev/urandom of=/tmp/blk bs=512 count=1 2>/dev/null
dd if=/tmp/blk of=/dev/nvme0n1 bs=512 count=1 oflag=direct 2>/dev/null || fail "write for compare"
nvme compare /dev/nvme0n1 -s 0 -c 0 -z 512 -d /tmp/blk >/tmp/cmp.out 2>&1 || fail "compare equal: $(cat /tmp/cmp.out)"
head -c 512 /dev/zero >/tmp/zero
nvme compare /dev/nvme0n1 -s 0 -c 0 -z 512 -d /tmp/zero >/tmp/cmp2.out 2>&1 && fail "compare of different data succeeded"
echo "compare: equal ok, different: $(tail -1 /tmp/cmp2.out)"
echo "== write-zeroes + dsm"; nvme write-zeroes /dev/nvme0n1 -s 0 -c 7 || fail "write-zeroes"
nvme dsm /dev/nvme0n1 -d -s 8 -b 8 || fail "dsm"
echo "== reservations"
nvme resv-register /dev/nvme0n1 -n 1 --nrkey=0xa1 --rrega=0 >/tmp/r.out 2>&1 || fail "resv-register: $(cat /tmp/r.out)"
nvme resv-acquire /dev/nvme0n1 -n 1 --crkey=0xa1 --rtype=1 --racqa=0 >/tmp/r.out 2>&1 || fail "resv-acquire: $(cat /tmp/r.out)"
nvme resv-report /dev/nvme0n1 -n 1 --eds -o json >/tmp/r.out 2>&1 || fail "resv-report: $(cat /tmp/r.out)"
echo "resv-report: $(tr -d ' \n' </tmp/r.out)"
nvme resv-release /dev/nvme0n1 -n 1 --crkey=0xa1 --rtype=1 --rrela=0 >/tmp/r.out 2>&1 || fail "resv-release: $(cat /tmp/r.out)"
nvme resv-register /dev/nvme0n1 -n 1 --crkey=0xa1 --rrega=1 >/tmp/r.out 2>&1 || fail "unregister: $(cat /tmp/r.out)"
echo "== reset"; nvme reset /dev/nvme0 || fail "reset"
sleep 2
dd if=/dev/nvme0n1 of=/dev/null bs=1M count=4 iflag=direct 2>/dev/null || fail "read after reset"
nvme disconnect -n $SUBNQN >/dev/null
echo "RESULT ok admin-probe"
