#!/bin/sh
# 001 Fig. 9-11 / 004 Fig. 10-15 with real packets: runs plan-<D>ms.toml with `ipsan lab run`
# and, as soon as the lab's namespaces (ipsanlab<PID>-ini, -tgt) exist, records every packet
# in each (dumpcap -i any: the link's wan0 and, for IPsec, charon's TUN device, so both the
# ESP-in-UDP and the TCP inside it), headers only (128 bytes), until the lab exits.
# Then cut.py turns the two pcaps into packets-<D>ms.csv and packets-<D>ms-summary.csv.
# Usage: capture.sh IPSAN_BINARY DELAY_MS SCRATCH_DIR   (root: namespaces)
set -eu
bin=$1; d=$2; scratch=$3
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$scratch"
"$bin" lab run --plan "$here/plan-${d}ms.toml" --out "$scratch/run-${d}ms" --quiet &
lab=$!
while [ ! -e /run/netns/ipsanlab$lab-ini ] || [ ! -e /run/netns/ipsanlab$lab-tgt ]; do
  kill -0 $lab 2>/dev/null || { echo "lab exited before its namespaces appeared" >&2; exit 1; }
  sleep 0.05
done
sleep 0.2
ip netns exec ipsanlab$lab-ini dumpcap -q -i any -s 128 -w "$scratch/packets-${d}ms-ini.pcapng" &
ini=$!
ip netns exec ipsanlab$lab-tgt dumpcap -q -i any -s 128 -w "$scratch/packets-${d}ms-tgt.pcapng" &
tgt=$!
wait $lab || echo "lab exit status $?" >&2
kill -INT $ini $tgt 2>/dev/null || true
wait $ini $tgt 2>/dev/null || true
/usr/bin/python3 "$here/cut.py" "$scratch/packets-${d}ms-ini.pcapng" \
  "$scratch/packets-${d}ms-tgt.pcapng" "$scratch/run-${d}ms/results.json" "$here/packets-${d}ms.csv"
