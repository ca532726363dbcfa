#!/bin/bash
# peers with the final code (ipsan-int2 = 25ed9b8), 200 us halt polling (put back after)
cd /work/main
P=/sys/module/haltpoll/parameters/guest_halt_poll_ns
trap 'echo 0 > $P' EXIT
echo 200000 > $P
scripts/bench peers --secs 5 --reps 3 --size 1GiB --bin /work/notes/bin/ipsan-int2 --out /work/runs/s17/peers-final > /work/runs/s17/peers-final.log 2>&1
echo done > /work/runs/s17/peers-final.done
