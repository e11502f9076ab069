#!/usr/bin/env bash
# `make fuzz-smoke`: 15 s per cargo-fuzz target, where the machine has a
# nightly toolchain (cargo fuzz needs one, and a machine that lacks it can't
# fetch it here). Either way it writes one line to STATUS_FILE, which `make
# test` prints last. The same properties run as proptests, and every seed in
# fuzz/corpus/ is replayed through them, on every machine
# (core/tests/fuzz_equivalents.rs).
set -euo pipefail
cd "$(dirname "$0")/.."
status=$1
mkdir -p "$(dirname "$status")"
if rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
  bash fuzz/run.sh 15
  echo "the fuzz smoke run passed (15 s per target)" > "$status"
else
  echo "the fuzz smoke run did NOT run: no nightly toolchain (cargo fuzz needs one); its properties ran as proptests and every seed in fuzz/corpus/ was replayed instead" | tee "$status"
fi
