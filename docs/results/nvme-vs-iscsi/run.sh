#!/bin/bash
# NVMe/TCP against iSCSI, quiet: with the VM's idle vCPUs halting at once (as shipped), then
# with 200 us of guest halt polling (put back after). BIN: the release build measured. More,
# shorter reps than before (6 x 2 s): the VM's speed bands last seconds to minutes, and the
# goal is judged on the per-rep paired ratios.
BIN=${1:?release binary}
D=${2:-docs/results/nvme-vs-iscsi}
scripts/bench nvme --bin $BIN --reps 6 --secs 2 --size 1GiB --halt-poll 0 --out $D/halting
scripts/bench nvme --bin $BIN --reps 6 --secs 2 --size 1GiB --halt-poll 200000 --out $D/polling
