#!/usr/bin/env bash
# Runs every fuzz target for SECONDS each (default 60) with libFuzzer via
# cargo fuzz on the nightly toolchain, then prints the executions per target.
#
#   bash fuzz/run.sh 15        # smoke run (make fuzz-smoke)
#   bash fuzz/run.sh 600       # long run (make fuzz FUZZ_SECONDS=600)
#   FUZZ_TARGETS="args" bash fuzz/run.sh 30
#
# Seeds are read from fuzz/corpus/<target>/ (checked in, never written);
# what libFuzzer finds goes to fuzz/target/corpus/<target>/ (kept between
# local runs, ignored by git) and crashes to fuzz/artifacts/<target>/.
set -euo pipefail

SECONDS_PER_TARGET="${1:-60}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$HERE"
TARGETS=(${FUZZ_TARGETS:-args state bucket})

# cargo fuzz needs nightly (sanitizer flags). Where the machine has only
# its stable toolchain, say so instead of failing half-way; `make test` then
# relies on the proptest equivalents and the seed replay.
if ! rustup toolchain list | grep -q '^nightly'; then
  echo "fuzz: no nightly toolchain on this machine; cargo fuzz needs one (rustup toolchain install nightly, where rustup can reach its servers)" >&2
  exit 2
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "fuzz: installing cargo-fuzz"
  cargo install --locked cargo-fuzz
fi

start=$(date +%s)
cargo +nightly fuzz build
echo "fuzz: built in $(( $(date +%s) - start )) s"

declare -A EXECS
status=0
for t in "${TARGETS[@]}"; do
  work="target/corpus/$t"
  mkdir -p "$work" "artifacts/$t"
  log="target/fuzz-$t.log"
  echo "fuzz: $t for ${SECONDS_PER_TARGET} s"
  # First corpus dir is written to, the seed dir only read.
  if ! cargo +nightly fuzz run "$t" "$work" "corpus/$t" -- \
      -max_total_time="$SECONDS_PER_TARGET" -print_final_stats=1 \
      -timeout=10 -rss_limit_mb=2048 >"$log" 2>&1; then
    status=1
    echo "fuzz: $t FAILED; last lines of $HERE/$log:"
    tail -n 40 "$log"
    ls -1 "artifacts/$t" | sed "s|^|  artifact: $HERE/artifacts/$t/|"
  fi
  EXECS[$t]=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
  grep -aE '^Done [0-9]+ runs|^#[0-9]+ *DONE' "$log" | tail -n 1 | sed "s/^/  $t: /" || true
done

echo "fuzz: executions per target (${SECONDS_PER_TARGET} s each):"
for t in "${TARGETS[@]}"; do
  printf '  %-8s %s\n' "$t" "${EXECS[$t]:-?}"
done
echo "fuzz: total $(( $(date +%s) - start )) s"
exit $status
