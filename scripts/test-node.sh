#!/usr/bin/env bash
# `make test-node`: the Node package as users get it. The package is built
# and packed (npm pack), then installed into a scratch project (a copy of
# clients/node/test, with ioredis, node-redis, express, fastify, ... from
# its lockfile), and its tests run there against the servers of the root
# venv. The differential test against the Python package uses the wheel
# (`make python-wheel`) in a venv of its own. The scratch project also holds
# the TypeScript versions readme.test.mjs checks the README with, and the
# Express example's clone test runs git clone and npm install itself.
# Then the same tests again on Node 18, the oldest the package supports
# (package.json's engines): its binary comes from the npm registry's
# node-linux-<arch> package, into target/node18.
#   scripts/test-node.sh [TEST_FILE...]   (default: every test)
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
pkg=clients/node
scratch=target/node-test
pyvenv=target/node-test-python

(cd "$pkg" && npm ci --no-audit --no-fund --loglevel=error && npm pack --silent --pack-destination "$repo/target" >/dev/null)
tarball=$(ls -t target/redis-tokenbucket-*.tgz | head -1)

rm -rf "$scratch" && mkdir -p "$scratch"
cp "$pkg"/test/package.json "$pkg"/test/package-lock.json "$pkg"/test/*.mjs "$scratch"/
# The Express example beside them: its tests use the same server kit and
# the package as installed here.
mkdir -p "$scratch/express-gateway/test"
cp examples/express-gateway/*.mjs "$scratch/express-gateway/"
cp examples/express-gateway/test/*.mjs "$scratch/express-gateway/test/"
(cd "$scratch" && npm ci --no-audit --no-fund --loglevel=error &&
  npm install --no-save --no-audit --no-fund --loglevel=error "$repo/$tarball")

if [ ! -x "$pyvenv/bin/python" ] || [ "$(ls clients/python/dist/*.whl)" -nt "$pyvenv/bin/python" ]; then
  rm -rf "$pyvenv"
  python3 -m venv "$pyvenv"
  "$pyvenv/bin/pip" install -q --disable-pip-version-check redis==5.2.1 "$(ls clients/python/dist/*.whl)"
fi

node18=target/node18
node18_pkg="node-linux-$(node -p process.arch)@18.20.8"
if [ ! -x "$node18/node_modules/.bin/node" ]; then
  npm install --prefix "$node18" --no-save --no-audit --no-fund --loglevel=error "$node18_pkg"
fi

servers=$(cargo run -q --release -p testkit --no-default-features --bin tb-servers --)
cd "$scratch"
if [ $# -eq 0 ]; then set -- *.test.mjs express-gateway/test/*.test.mjs; fi
# The tests that compile and install (the README's TypeScript, the example
# from a clean clone) run after the others, alone: beside the timing tests
# their CPU would make calls shed.
light=() heavy=()
for file in "$@"; do
  case "$file" in
    readme.test.mjs | express-gateway/test/clone.test.mjs) heavy+=("$file") ;;
    *) light+=("$file") ;;
  esac
done
run() {
  env $servers TB_REPO="$repo" TB_PYTHON="$repo/$pyvenv/bin/python" TB_TARBALL="$repo/$tarball" "$@"
}
if [ ${#light[@]} -gt 0 ]; then run node --test --test-concurrency=2 --test-timeout=120000 "${light[@]}"; fi
if [ ${#heavy[@]} -gt 0 ]; then run node --test --test-concurrency=1 --test-timeout=600000 "${heavy[@]}"; fi
echo "== the same tests on Node $("$repo/$node18/node_modules/.bin/node" --version)"
# Node 18's runner has neither --test-concurrency nor --test-timeout.
PATH="$repo/$node18/node_modules/.bin:$PATH" run node --test "$@"
