#!/bin/sh
# nvmevm guest script: Linux's host against Linux's target in one guest with a SHA-384 ("02")
# configured PSK (`nvme gen-tls-key --hmac 2 --insert`), tlshd doing both handshakes.
#   ../shared/nvmevm/run.sh --script crates/nvme-tls/tests/vm/sha384-selftest.sh --env TLSHD_LOGLEVEL=7
# On Debian 13 (kernel 6.12, ktls-utils 1.0.0, 2026-11-27) it fails: "queue 0: TLS handshake
# complete, error -5". tlshd 1.0.0's PSK path that picks SHA-384 (HAVE_GNUTLS_PSK_ALLOCATE_
# CREDENTIALS2) does not compile (fixed in ktls-utils 1.3.0, commit dd10615), so it is built
# without it and GnuTLS binds every PSK to SHA-256: 02 keys work with no Linux peer of that
# release. See docs/nvme.md.
set -u
S=nqn.2026-11.org.example:selftest H=$(cat /etc/nvme/hostnqn)
fail() { echo "RESULT fail $*"; echo "--- tlshd.log"; cat /tmp/tlshd.log; echo "--- dmesg"; dmesg | grep -i 'nvme\|tls\|handshake' | tail -8; exit 0; }
N=/sys/kernel/config/nvmet
mkdir $N/subsystems/$S && echo 1 >$N/subsystems/$S/attr_allow_any_host || fail "no nvmet configfs"
mkdir $N/subsystems/$S/namespaces/1
echo /dev/nullb0 >$N/subsystems/$S/namespaces/1/device_path && echo 1 >$N/subsystems/$S/namespaces/1/enable
echo "tlshd: $(tlshd --version 2>&1 | head -1)"
nvme gen-tls-key --hostnqn "$H" --subsysnqn $S --hmac 2 --insert >/tmp/key.out 2>&1 || fail "gen-tls-key: $(cat /tmp/key.out)"
cat /tmp/key.out
tlshd -c /etc/tlshd.conf >/tmp/tlshd.log 2>&1 &
sleep 1
mkdir $N/ports/2; echo tcp >$N/ports/2/addr_trtype; echo ipv4 >$N/ports/2/addr_adrfam
echo 127.0.0.1 >$N/ports/2/addr_traddr; echo 4421 >$N/ports/2/addr_trsvcid; echo tls1.3 >$N/ports/2/addr_tsas
ln -s $N/subsystems/$S $N/ports/2/subsystems/$S
nvme connect -t tcp -a 127.0.0.1 -s 4421 -n $S --tls >/dev/null 2>/tmp/c.err || fail "TLS connect with a 02 key: $(cat /tmp/c.err)"
echo "RESULT ok sha384 $(dmesg | grep -o 'TLS handshake[^,]*' | tail -1)"
