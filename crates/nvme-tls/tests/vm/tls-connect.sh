#!/bin/sh
# nvmevm guest script: Linux's host opens one NVMe/TCP connection with TLS to a target on this
# machine (10.0.2.2:PORT), its key inserted as an operator would: `nvme check-tls-key --insert
# --identity IDENTITY` (0: NVMe0R0H <hostnqn> <subnqn>, 1: NVMe1R0H … <digest>), tlshd doing
# the handshake. Settings: PORT, SUBNQN, TLS_KEY, IDENTITY (default 0). Used by
# crates/nvme-tls/tests/linux_host.rs, which only checks the TLS half: the connect itself fails
# there (no NVMe target answers), so this prints RESULT ok once it has tried.
set -u
: "${PORT:?}" "${SUBNQN:?}" "${TLS_KEY:?}"
H=$(cat /etc/nvme/hostnqn)
nvme check-tls-key --hostnqn "$H" --subsysnqn "$SUBNQN" --keydata "$TLS_KEY" --identity "${IDENTITY:-0}" \
  --insert >/tmp/key.out 2>&1 || { echo "RESULT fail the TLS key was refused: $(cat /tmp/key.out)"; exit 0; }
echo "inserted: $(cat /tmp/key.out)"
tlshd -c /etc/tlshd.conf >/tmp/tlshd.log 2>&1 &
sleep 1
nvme connect -t tcp -a 10.0.2.2 -s "$PORT" -n "$SUBNQN" -q "$H" --tls >/tmp/c.out 2>&1
echo "connect: $(cat /tmp/c.out | head -2)"
dmesg | grep -i 'nvme\|tls' | tail -4
echo "RESULT ok tried"
