#!/bin/bash
# trace.sh BIN OUTDIR SIDES... (root; repository root or anywhere): one link (1 Gbit/s, 32 ms one way), a target of BIN, and per
# side (iperf3 | write | read) a 10 s run with perf recording tcp_probe (the sender's ACKs)
# and sock_send_length (every write's length / error) system-wide, in OUTDIR/SIDE.perf.data;
# then probe.py SIDE.perf.data | gzip > SIDE.probe.csv.gz and pacing.py *.probe.csv.gz.
# Sealed AES-256-GCM, bench 64 x 256 KiB (BS, DEPTH), cubic everywhere. Environment:
# LOSS (0%), SECS (10), TGT_TCP (a line for the target's [server.tcp], e.g. 'sndbuf = 4194304'),
# IPERF_ARGS (e.g. '-w 4M'), BENCH_ARGS. Link w28c, 10.231.28.0/24; removed on exit.
set -u
BIN=$1; OUT=$2; shift 2
NAME=w28c; NET=10.231.28; TGT=$NET.2; PORT=3260
LOSS=${LOSS:-0%}; SECS=${SECS:-10}; BS=${BS:-256KiB}; DEPTH=${DEPTH:-64}
mkdir -p $OUT
W=$(mktemp -d /tmp/ipsan-trace.XXXX)
cleanup() { [ -n "${TP:-}" ] && kill $TP 2>/dev/null; [ -n "${IP:-}" ] && kill $IP 2>/dev/null; wait 2>/dev/null; $BIN wan down --name $NAME >/dev/null 2>&1; rm -rf $W; }
trap cleanup EXIT
head -c 32 /dev/urandom | xxd -p -c 64 > $W/wan.key; chmod 600 $W/wan.key
$BIN wan up --name $NAME --subnet $NET.0/24 --delay 32ms --rate 0 --loss 0% > $OUT/link.txt || exit 1
$BIN wan set --name $NAME --rate 1gbit --loss $LOSS >/dev/null || exit 1
cat > $W/t.toml <<EOT
[server]
portals = ["$TGT:$PORT"]
connections_per_session = 8
[server.tcp]
congestion = "cubic"
${TGT_TCP:-}
[[target]]
iqn = "iqn.2026-11.org.ipsan:diag"
[target.seal]
policy = "required"
secret_file = "$W/wan.key"
[[target.lun]]
id = 0
backend = "mem:128MiB"
EOT
ip netns exec $NAME-tgt nice -n -10 $BIN target --config $W/t.toml > $OUT/target.out 2> $OUT/target.log & TP=$!
ip netns exec $NAME-tgt nice -n -10 iperf3 -s -B $TGT -p 5201 > /dev/null 2>&1 & IP=$!
for i in $(seq 50); do grep -q "listening on" $OUT/target.out 2>/dev/null && break; sleep 0.2; done
URL=iscsi://$TGT:$PORT/iqn.2026-11.org.ipsan:diag/0
for side in "$@"; do
  rw=${side%%-*}
  case $rw in iperf3) F="dport == 5201 && data_len == 0";; write) F="dport == $PORT && data_len == 0";; read) F="sport == $PORT && data_len == 0";; esac
  perf record -q -a -e tcp:tcp_probe --filter "$F" -e sock:sock_send_length -o $OUT/$side.perf.data > /dev/null 2>&1 & PP=$!
  sleep 1
  echo "$side start $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $OUT/runs.txt
  if [ $rw = iperf3 ]; then
    ip netns exec $NAME-ini nice -n -10 iperf3 -c $TGT -p 5201 -t $SECS -C cubic ${IPERF_ARGS:-} -J > $OUT/$side.json
  else
    ip netns exec $NAME-ini nice -n -10 $BIN bench $URL --rw $rw --bs $BS --depth $DEPTH --time ${SECS}s \
      --seal aes-256-gcm --secret-file $W/wan.key --tcp-congestion cubic ${BENCH_ARGS:-} \
      --command-timeout 0 --recovery-timeout 0 > $OUT/$side.txt 2>&1
  fi
  kill -INT $PP; wait $PP
  $BIN wan stats --name $NAME >> $OUT/runs.txt
done
