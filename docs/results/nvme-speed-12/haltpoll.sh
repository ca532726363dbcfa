#!/bin/bash
# haltpoll.sh NS CMD... — runs CMD with this VM's guest_halt_poll_ns at NS, then puts the old
# value back (as scripts/bench nvme --halt-poll does; docs/results/vcpu-halt).
F=/sys/module/haltpoll/parameters/guest_halt_poll_ns
old=$(cat $F)
trap 'echo $old > $F' EXIT
echo "$1" > $F
shift
"$@"
