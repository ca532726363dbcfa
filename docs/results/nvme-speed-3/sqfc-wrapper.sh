#!/bin/bash
# The r-nvspeed build with --sq-flow-control on every NVMe bench (for prof.sh's A/B of the SUCCESS flag).
if [ "$1" = bench ] && [[ "$2" == nvme+tcp* ]]; then exec /work/tgt-nvspeed/ipsan-nvspeed "$@" --sq-flow-control; fi
exec /work/tgt-nvspeed/ipsan-nvspeed "$@"
