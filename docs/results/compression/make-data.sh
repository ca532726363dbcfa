#!/bin/bash
# Builds the three data sets of docs/results/compression (128 MiB each) in DIR:
#   docs/results/compression/make-data.sh DIR [MAIN-CHECKOUT]
# vm.img: a sparse ext4 image with a few files (zeros-heavy, like a fresh VM disk);
# src.img: an ext4 image holding MAIN-CHECKOUT's tracked sources (git ls-files);
# random.img: /dev/urandom.
set -euo pipefail
main=$(readlink -f "${2:-/work/main}")
mkdir -p "$1"; cd "$1"
SZ=128M
# 1. zeros-heavy VM image: a sparse ext4 image with a few files (some binaries and docs).
rm -f vm.img; truncate -s $SZ vm.img
mkdir -p vmroot/usr/bin vmroot/etc vmroot/doc
cp /usr/bin/ls /usr/bin/bash /usr/bin/tar /usr/bin/grep /usr/bin/sed vmroot/usr/bin/
cp /etc/passwd /etc/group /etc/services vmroot/etc/ 2>/dev/null || true
cp "$main/README.md" "$main/docs/seal.md" vmroot/doc/
mkfs.ext4 -q -F -d vmroot vm.img
# 2. a source tree's ext4 image: /work/main's sources (no build output, no .git).
rm -rf srcroot; mkdir srcroot
(cd "$main" && git ls-files -z | tar --null -T - -cf -) | tar -C srcroot -xf -
rm -f src.img; truncate -s $SZ src.img
mkfs.ext4 -q -F -d srcroot src.img
# 3. random data.
head -c $SZ /dev/urandom > random.img
ls -ls *.img
