#!/usr/bin/env bash
# `make bench-node`: the Node client measured (clients/node/bench/bench.mjs):
# the package packed and installed into the bench project, whose lockfile
# brings the peers (bench-only dependencies); writes docs/benchmarks.md and
# the table in clients/node/README.md.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
(cd clients/node && npm ci --no-audit --no-fund --loglevel=error && npm pack --silent --pack-destination "$repo/target" >/dev/null)
tarball=$(ls -t target/redis-tokenbucket-*.tgz | head -1)
cd clients/node/bench
npm ci --no-audit --no-fund --loglevel=error
npm install --no-save --no-audit --no-fund --loglevel=error "$repo/$tarball"
node bench.mjs --module "$repo/target/release/libredis_tokenbucket.so" \
  --report "$repo/docs/benchmarks.md" --readme "$repo/clients/node/README.md"
