#!/bin/bash
# Ad-hoc diagnosis (not the sweep): 8-connection sealed writes at 100 Mbit/s, 32 ms one way, 0.1 % loss, cubic:
# ImmediateData=Yes (the default) vs No (data as unsolicited Data-Out), alternated.
set -u
B=/work/notes/bin/ipsan-3378dc6; name=wsx; net=10.231.149; out=$1; mkdir -p $out
work=$(mktemp -d); head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > $work/key; chmod 600 $work/key
cat > $work/t.toml <<T
[server]
portals = ["$net.2:3260"]
connections_per_session = 8
[server.tcp]
congestion = "cubic"
[[target]]
iqn = "iqn.2026-11.org.ipsan:sweep"
[target.seal]
policy = "required"
secret_file = "$work/key"
[[target.lun]]
id = 0
backend = "mem:128MiB"
T
$B wan up --name $name --subnet $net.0/24 --delay 32ms --rate 100mbit --loss ${LOSS:-0.1%} > $out/link.txt
nice -n -10 ip netns exec $name-tgt $B target --config $work/t.toml > $work/t.out 2> $out/target.log & tp=$!
sleep 2
for rep in 1 2 3; do
  for v in ${VARIANTS:-imm-yes imm-no}; do
    case $v in imm-yes) x=();; imm-no) x=(--immediate-data no);; d256) x=(--depth 128 --bs 64KiB);; esac
    nice -n -10 ip netns exec $name-ini $B bench iscsi://$net.2:3260/iqn.2026-11.org.ipsan:sweep/0 --rw ${RW:-write} --bs 32KiB --depth 64 \
      --time 15s --seal aes-256-gcm --secret-file $work/key --tcp-congestion cubic --connections ${N:-8} --command-timeout 0 --recovery-timeout 0 \
      --quiet --json $out/$v-$rep.json "${x[@]}" > $out/$v-$rep.txt 2>&1
    python3 -c "import json; r=json.load(open('$out/$v-$rep.json'))['result']; print('$v', $rep, round(r['throughput_mb_s'],2), '$(cut -d' ' -f1 /proc/loadavg)')" | tee -a $out/results.txt
  done
done
kill $tp; wait $tp; $B wan down --name $name; rm -rf $work
