#!/bin/bash
# ipsan's NVMe/TCP host (BIN) against Linux nvmet in the nvmevm guest: what
# tests/nvme_linux_target.rs's first test runs, with a given binary.
BIN=$1; OUT=$2
mkdir -p $OUT
NV=/work/shared/nvmevm
P=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
$NV/run.sh --script $NV/guest/nvmet-serve.sh --hostfwd $P:4420 --env SERVE_SECONDS=300 --timeout 360 -q --log $OUT/console.log </dev/null >/dev/null 2>&1 &
VM=$!
trap 'kill -TERM $VM 2>/dev/null; wait $VM' EXIT
for i in $(seq 480); do grep -q "NVMET ready" $OUT/console.log 2>/dev/null && break; sleep 0.5; done
grep -q "NVMET ready" $OUT/console.log || { echo "VM not ready"; exit 1; }
U=nvme+tcp://127.0.0.1:$P/nqn.2026-11.org.example:nvmet/1
set -x
timeout 120 $BIN bench $U --rw write --bs 1MiB --depth 4 --size 16MiB --verify --queues 2 --digest both --quiet --json $OUT/w.json
timeout 120 $BIN bench $U --rw randwrite --bs 4KiB --depth 32 --size 8MiB --offset 64MiB --verify --queues 2 --quiet
timeout 120 $BIN bench $U --rw read --bs 64KiB --depth 8 --size 16MiB --verify --quiet
timeout 120 $BIN bench $U --rw read --bs 1MiB --depth 16 --size 64MiB --queues 2 --digest both --quiet
timeout 120 $BIN bench $U --rw read --bs 4KiB --depth 32 --size 16MiB --queues 2 --quiet --sq-flow-control
