#!/bin/bash
# experiment: pin each new charon's threads; first seen -> cpu $1, second -> cpu $2
declare -A seen; n=0
while true; do
  for p in $(pgrep -x charon); do
    if [ -z "${seen[$p]}" ]; then
      seen[$p]=1; if (( n % 2 == 0 )); then c=$1; else c=$2; fi; n=$((n+1))
      taskset -a -p -c $c $p >/dev/null 2>&1
    fi
  done
  sleep 0.05
done
