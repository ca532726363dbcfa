#!/bin/sh
B=/work/notes/bin/ipsan-s25base
if [ "$1" = target ] && [ "$2" = --config ]; then
  sed 's/^\[server.tcp\]$/[server.tcp]\nsndbuf = 2097152/' "$3" > "$3.sb2097152"
  c="$3.sb2097152"; shift 3
  exec $B target --config "$c" "$@"
fi
if [ "$1" = bench ]; then exec $B "$@" --tcp-sndbuf 2097152; fi
exec $B "$@"
