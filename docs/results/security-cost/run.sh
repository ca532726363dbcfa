#!/usr/bin/env bash
# Issue 31's cost check: the data path and the login time of the security work, old (98d9f39)
# against new, side by side in one run on one machine.
#   OLD_TREE: a checkout of 98d9f39 with crates/ipsan-initiator/tests/seal_login_time.rs copied
#             in (the test uses only API both revisions have), built with
#             `cargo build --release --bin ipsan` and
#             `cargo test --release -p ipsan-initiator --test seal_login_time --no-run`
#   NEW_TREE: this checkout, built the same way.
# Writes into this directory: machine.txt, bench-seal-*.txt/jsonl, login-time.txt.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
OLD_TREE=${OLD_TREE:?checkout of 98d9f39}
NEW_TREE=${NEW_TREE:-$(cd "$here/../../.." && pwd)}
old="$OLD_TREE/target/release/ipsan"
new="$NEW_TREE/target/release/ipsan"
{
  echo "date: $(date -u +%FT%TZ)"
  echo "old: 98d9f39 ($old)"
  echo "new: $(git -C "$NEW_TREE" rev-parse --short HEAD) ($new)"
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores"
  echo "kernel: $(uname -r)"
  echo "load at start: $(cat /proc/loadavg)"
} > "$here/machine.txt"
# Data path: 1 MiB x 16 (the issue's cell) and 4 KiB x 32, plain / none / AES-256-GCM, A = old, B = new.
"$NEW_TREE/scripts/bench-seal" --bin "$old" --bin-b "$new" --reps 5 --size 2GiB \
  --ciphers plain,none,aes-256-gcm --rw write,read --raw "$here/bench-seal-1m.jsonl" \
  | tee "$here/bench-seal-1m.txt"
"$NEW_TREE/scripts/bench-seal" --bin "$old" --bin-b "$new" --reps 9 --size 128MiB --bs 4KiB \
  --depth 32 --ciphers plain,aes-256-gcm --rw write,read --raw "$here/bench-seal-4k.jsonl" \
  | tee "$here/bench-seal-4k.txt"
# Login time: the median of 100 sealed logins on loopback, old and new alternated four times.
: > "$here/login-time.txt"
for i in 1 2 3 4; do
  for side in old new; do
    tree=$OLD_TREE; [ "$side" = new ] && tree=$NEW_TREE
    t=$(ls -t "$tree"/target/release/deps/seal_login_time-* | grep -v '\.d$' | head -1)
    echo "$side $i: $("$t" --ignored --nocapture 2>&1 | grep 'sealed login')" >> "$here/login-time.txt"
  done
done
echo "load at end: $(cat /proc/loadavg)" >> "$here/machine.txt"
cat "$here/login-time.txt"
