#!/bin/bash
# NVMe/TCP against iSCSI, quiet: with the VM's idle vCPUs halting at once (as shipped), then
# with 200 us of guest halt polling (put back by the trap). BIN: the release build measured.
BIN=${1:-/work/notes/bin/ipsan-s18b}
D=${2:-docs/results/nvme-vs-iscsi}
P=/sys/module/haltpoll/parameters/guest_halt_poll_ns
trap 'echo 0 > $P' EXIT
echo 0 > $P
scripts/bench nvme --bin $BIN --reps 3 --secs 3 --size 1GiB --out $D/halting
scripts/bench nvme --bin $BIN --reps 3 --secs 3 --size 1GiB --halt-poll 200000 --out $D/polling
