#!/bin/bash
# usage: fresh.sh TAG [target extra args] -- [bench extra args]; link dbg must be up
B=/work/wt/demo/target/release/ipsan
N=dbg; T=$1; shift
TA=(); while [ $# -gt 0 ] && [ "$1" != "--" ]; do TA+=("$1"); shift; done; shift
ip netns exec $N-tgt $B target --portal 0.0.0.0:3260 --iqn iqn.2026-11.org.ipsan:lab --lun mem:256MiB --queue-depth 32 "${TA[@]}" > /tmp/dbg/$T.target.log 2>&1 &
TP=$!
for i in $(seq 50); do grep -q listening /tmp/dbg/$T.target.log && break; sleep 0.1; done
ip netns exec $N-ini $B bench iscsi://10.231.77.2:3260/iqn.2026-11.org.ipsan:lab/0 --rw write --bs 1048576 --quiet --json /tmp/dbg/$T.json --trace /tmp/dbg/$T.trace --depth 8 --time 3500ms "$@" > /tmp/dbg/$T.out 2>&1 &
BP=$!
: > /tmp/dbg/$T.ss
while kill -0 $BP 2>/dev/null; do
  echo "t=$(date +%s.%N)" >> /tmp/dbg/$T.ss
  ip netns exec $N-tgt ss -tmi state established '( sport = :3260 )' | tail -n +2 >> /tmp/dbg/$T.ss
  ip netns exec $N-ini ss -tmi state established '( dport = :3260 )' | tail -n +2 >> /tmp/dbg/$T.ss
  sleep 0.2
done
kill $TP; wait $TP 2>/dev/null
python3 - "$T" <<'PY'
import json,sys
T=sys.argv[1]
j=json.load(open(f'/tmp/dbg/{T}.json')); r=j['result']; ti=j['tcp']['info_end']
print(f"{T}: whole={r['throughput_mb_s']:.2f} bytes={r['bytes']>>20}MiB p50={r['latency_us']['p50']/1e3:.0f}ms rwnd_lim={ti['rwnd_limited_us']//1000}ms busy={ti['busy_time_us']//1000}ms cwnd={ti['cwnd']} snd_wnd={ti['snd_wnd']}")
PY
