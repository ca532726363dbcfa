#!/bin/bash
# The codec comparison behind docs/seal.md §4b (*Why LZ4*): per independent 64 KiB chunk, one
# core, on the three data sets: lz4_flex (what Seal uses; the example
# crates/ipsan-seal/examples/codec.rs), and the C reference codecs' own benchmarks, LZ4 level 1
# and zstd levels 1 and 3.
#   docs/results/compression/codec.sh DATADIR [CODEC-EXAMPLE-BINARY] > codec.txt
# (the example's binary: target/release/examples/codec after
#  `cargo build --release -p ipsan-seal --example codec`; without it only the C codecs run)
set -euo pipefail
data=$1; ex=${2:-}
echo "machine: $(nproc) vCPUs, $(uname -r), $(date -u +%FT%TZ); load $(cat /proc/loadavg)"
echo "lz4 $(lz4 --version 2>&1 | head -1)"
echo "zstd $(zstd --version 2>&1 | head -1)"
for ds in vm src random; do
  f="$data/$ds.img"
  echo "== $ds.img"
  [ -n "$ex" ] && "$ex" "$f" 65536 3
  echo "lz4 -1 (C), 64 KiB independent blocks: $(lz4 -b1 -B65536 -i3 "$f" 2>&1 | tr '\r' '\n' | grep -E 'MB/s.*MB/s' | tail -1)"
  for l in 1 3; do
    echo "zstd -$l (C), 64 KiB independent chunks: $(zstd -b$l -B65536 -i3 "$f" 2>&1 | tr '\r' '\n' | grep -E 'MB/s.*MB/s' | tail -1)"
  done
done
echo "load at end: $(cat /proc/loadavg)"
