#!/usr/bin/env bash
# From-scratch `cargo test -p nvme-proto --no-run` (10 integration-test binaries + the lib's),
# HEAD's dev profile (a) and line-tables-only for the workspace + no debug info for deps (b),
# alternated a b b a.
set -u
cd /work/wt-testtime
R=/work/tgt-testtime/results
mkdir -p $R
i=0
for v in a b b a; do
  i=$((i+1))
  export CARGO_TARGET_DIR=/work/tgt-testtime/m-$v
  rm -rf "$CARGO_TARGET_DIR"
  cfg=()
  [ $v = b ] && cfg=(--config 'profile.dev.debug="line-tables-only"' --config 'profile.dev.package."*".debug=false')
  echo "run $i $v start $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" >>$R/nvme-proto.txt
  /usr/bin/time -f "run $i $v: %e s wall, %U s user, %S s sys" -a -o $R/nvme-proto.txt cargo "${cfg[@]}" test -p nvme-proto --no-run >$R/nvme-proto-$i-$v.log 2>&1
  echo "run $i $v end $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg) target $(du -sm $CARGO_TARGET_DIR | cut -f1) MB, test executables $(find $CARGO_TARGET_DIR/debug/deps -maxdepth 1 -type f -perm -u+x ! -name '*.so' -printf '%s\n' | awk '{n++; s+=$1} END {printf "%d, %.0f MB", n, s/1e6}')" >>$R/nvme-proto.txt
done
rm -rf /work/tgt-testtime/m-a /work/tgt-testtime/m-b
