#!/bin/sh
# Guest script for ../shared/nvmevm (Linux 6.12, nvme-cli 2.13): the Linux host's keep-alive
# timeout when ipsan's target stops answering, and its reconnect once the target answers again
# (issue 30). Settings: PORT, SUBNQN; KATO (seconds, default 5). It needs someone on this
# machine to stop the target: tests/nvme_linux.rs watches the console log for two lines,
#   "KATO stop"  -> it sends SIGSTOP to the target (the target's kernel still ACKs, nothing answers)
#   "KATO cont"  -> it sends SIGCONT
# Steps: connect with --keep-alive-tmo $KATO --reconnect-delay 1 --ctrl-loss-tmo 120; write a
# random block (O_DIRECT); clear dmesg and print "KATO stop"; wait (at most 3*KATO+30 s) for the
# host's Keep Alive (opcode 0x18) timing out on the admin queue (QID 0) and "starting error
# recovery"; print "KATO cont"; wait (at most 90 s) for "Successfully reconnected" and the
# controller live; read the block back and compare. "RESULT ok keep-alive-timeout …" only then.
# By hand: start `ipsan target … --nvme-listen 127.0.0.1:PORT`, run
#   ../shared/nvmevm/run.sh --script crates/nvme-proto/tests/vm/keep-alive.sh --log /tmp/ka.log \
#       --env PORT=PORT --env SUBNQN=nqn… &
# and `kill -STOP`/`kill -CONT` the target when those lines appear in /tmp/ka.log.
set -u
A=10.0.2.2 H=$(cat /etc/nvme/hostnqn) KATO=${KATO:-5}
fail() { echo "RESULT fail $*"; dmesg | grep -i nvme | tail -20; exit 0; }
now() { cut -d. -f1 /proc/uptime; }
nvme connect -t tcp -a $A -s $PORT -n $SUBNQN -q $H -i 1 --keep-alive-tmo $KATO \
    --reconnect-delay 1 --ctrl-loss-tmo 120 >/tmp/c.out 2>&1 || fail "connect: $(cat /tmp/c.out)"
i=0; while [ ! -b /dev/nvme0n1 ] && [ $i -lt 100 ]; do sleep 0.2; i=$((i + 1)); done
[ -b /dev/nvme0n1 ] || fail "no /dev/nvme0n1"
[ "$(cat /sys/class/nvme/nvme0/kato 2>/dev/null || echo $KATO)" = "$KATO" ] || fail "kato $(cat /sys/class/nvme/nvme0/kato)"
dd if=/dev/urandom of=/tmp/blk bs=4096 count=1 2>/dev/null
dd if=/tmp/blk of=/dev/nvme0n1 bs=4096 count=1 seek=100 oflag=direct 2>/dev/null || fail "write"
dmesg -c >/dev/null
t0=$(now)
echo "KATO stop: the host now waits for its keep-alive timeout (${KATO} s)"
limit=$((3 * KATO + 30)) seen=
while [ $(($(now) - t0)) -lt $limit ]; do
  if dmesg | grep -q 'opcode 0x18 .*QID 0 timeout' && dmesg | grep -q 'starting error recovery'; then
    seen=$(($(now) - t0)); break
  fi
  sleep 0.5
done
dmesg | grep -i nvme
[ -n "$seen" ] || fail "no keep-alive timeout within ${limit} s of the target stopping"
echo "KATO cont: keep-alive timeout seen after ${seen} s"
t1=$(now) back=
while [ $(($(now) - t1)) -lt 90 ]; do
  if dmesg | grep -q 'Successfully reconnected' && [ "$(cat /sys/class/nvme/nvme0/state 2>/dev/null)" = live ]; then
    back=$(($(now) - t1)); break
  fi
  sleep 0.5
done
dmesg | grep -i nvme | grep -iv 'opcode 0x18' | tail -8
[ -n "$back" ] || fail "the host did not reconnect within 90 s of the target answering again (state $(cat /sys/class/nvme/nvme0/state 2>/dev/null))"
dd if=/dev/nvme0n1 of=/tmp/back bs=4096 count=1 skip=100 iflag=direct 2>/dev/null || fail "read after reconnect"
cmp -s /tmp/blk /tmp/back || fail "the block read after the reconnect differs"
nvme disconnect -n $SUBNQN >/dev/null
echo "RESULT ok keep-alive-timeout=${seen}s kato=${KATO}s reconnected=${back}s data=same"
