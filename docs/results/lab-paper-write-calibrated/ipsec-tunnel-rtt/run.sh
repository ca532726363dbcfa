#!/bin/bash
# Issue 29 (lab29): the IPsec 0/1 ms points with the tunnel's RTT calibrated, then Fig. 11 in the papers' regime.
B=/work/tgt-lab29/release/ipsan
W=/work/wt-lab29
for what in ipsec fig11; do
  if [ $what = ipsec ]; then D=/work/scratch-lab29/ipsec; P=$W/docs/results/lab-paper-write-calibrated/ipsec-tunnel-rtt/plan.toml
  else D=/work/scratch-lab29/fig11; P=$W/docs/results/lab-paper-regime/fig11/plan.toml; fi
  mkdir -p $D && cp $P $D/plan.toml && cd $W
  echo "start $(date -u +%T) load $(cat /proc/loadavg)" > $D/times.txt
  timeout 600 $B lab calibrate --plan $D/plan.toml --out $D/cal.json --quiet > $D/cal.log 2>&1
  echo "cal done $(date -u +%T) load $(cat /proc/loadavg) rc $?" >> $D/times.txt
  timeout 1800 $B lab run --plan $D/plan.toml --calibration $D/cal.json --out $D/out --quiet > $D/run.log 2>&1
  echo "run done $(date -u +%T) load $(cat /proc/loadavg) rc $?" >> $D/times.txt
done
