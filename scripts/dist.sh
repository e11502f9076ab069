#!/usr/bin/env bash
# `make dist`: the tree `make install` makes, staged under one directory and
# packed with a SHA-256 file, as a release page offers. Owner, order, modes
# and times are fixed, so the same commit packs the same bytes.
#   scripts/dist.sh DIST_DIR NAME
set -euo pipefail
cd "$(dirname "$0")/.."
dir=$1 name=$2
rm -rf "$dir/$name" "$dir/$name.tar.gz" "$dir/$name.tar.gz.sha256"
make --no-print-directory install DESTDIR= PREFIX="$PWD/$dir/$name"
tar -C "$dir" --sort=name --owner=0 --group=0 --numeric-owner \
  --mode='u+rwX,go+rX,go-w' --mtime=@"$(git log -1 --format=%ct 2>/dev/null || date +%s)" \
  -cf - "$name" | gzip -9n > "$dir/$name.tar.gz"
(cd "$dir" && sha256sum "$name.tar.gz" > "$name.tar.gz.sha256")
rm -rf "${dir:?}/$name"
echo "$dir/$name.tar.gz"
