#!/bin/sh
B=/work/notes/bin/ipsan-s25base
if [ "$1" = target ] && [ "$2" = --config ]; then
  sed 's/^\[server.tcp\]$/[server.tcp]\nsndbuf = 3145728/' "$3" > "$3.sb3145728"
  c="$3.sb3145728"; shift 3
  exec $B target --config "$c" "$@"
fi
if [ "$1" = bench ]; then exec $B "$@" --tcp-sndbuf 3145728; fi
exec $B "$@"
