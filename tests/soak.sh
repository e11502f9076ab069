#!/usr/bin/env bash
# Soak test: the module at full speed for SOAK_SECONDS (default 600) under a
# mix of TB.CONSUME, TB.MCONSUME, TB.PEEK and TB.ADJUST on random keys
# (redis-benchmark), sampling the server's RSS every 10 s. Fails if RSS
# grows more than SOAK_MAX_GROWTH_PCT (default 5) % above the first sample
# taken after the warm-up (the first minute, or a third of a shorter run),
# if the server dies, or if any command panicked or failed.
#
#   make soak                      # ten minutes
#   SOAK_SECONDS=120 bash tests/soak.sh
#
# Not part of CI. Needs redis-server and redis-benchmark (make deps) and
# the release build (make build).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MODULE="${TB_MODULE:-$ROOT/target/release/libredis_tokenbucket.so}"
SERVER="${TB_REDIS_SERVER:-redis-server}"
DURATION="${SOAK_SECONDS:-600}"
MAX_GROWTH="${SOAK_MAX_GROWTH_PCT:-5}"
INTERVAL=10
WARMUP=$(( DURATION / 3 < 60 ? DURATION / 3 : 60 ))

[ -f "$MODULE" ] || { echo "soak: no module at $MODULE (make build)"; exit 2; }
command -v redis-benchmark >/dev/null || { echo "soak: redis-benchmark missing (make deps)"; exit 2; }

PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
DIR=$(mktemp -d "${TMPDIR:-/tmp}/tb-soak.XXXXXX")
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  if [ "${KEEP_DIR:-0}" = 1 ]; then echo "soak: logs kept in $DIR"; else rm -rf "$DIR"; fi
}
trap cleanup EXIT

"$SERVER" --port "$PORT" --bind 127.0.0.1 --dir "$DIR" --logfile server.log \
  --save '' --appendonly no --loadmodule "$MODULE" &
SERVER_PID=$!
PIDS+=("$SERVER_PID")
cli() { redis-cli -p "$PORT" "$@"; }
for _ in $(seq 100); do cli PING >/dev/null 2>&1 && break; sleep 0.1; done
cli PING >/dev/null

info() { cli INFO "$1" | tr -d '\r' | sed -n "s/^$2://p"; }
rss_kb() { awk '/^VmRSS:/ {print $2}' "/proc/$SERVER_PID/status"; }

# The load: each redis-benchmark loops forever (-l) until killed. The live
# set is bounded, so that RSS measures leaks rather than how many buckets
# happen to be alive:
#  * 100k + 100k long-lived buckets (max 1e6 at 0.001/s: once touched, a
#    bucket stays in debt of fullness for the whole run), hit by TB.CONSUME,
#    TB.MCONSUME, TB.PEEK and TB.ADJUST (charges and refunds);
#  * 10k short-lived buckets (drained, they expire 1 s later): constant
#    churn of key creation, deletion and active expiry.
bench() {
  redis-benchmark -p "$PORT" -q -l -c 25 -P 8 -r "$1" "${@:2}" >>"$DIR/bench.log" 2>&1 &
  PIDS+=("$!")
}
bench 100000 TB.CONSUME 'l:__rand_int__' 1e6 0.001 1
bench 10000 TB.CONSUME 's:__rand_int__' 5 5 5
bench 100000 TB.MCONSUME 'l:__rand_int__' 1e6 0.001 2 'm:__rand_int__' 1e6 0.001 1 's:__rand_int__' 5 5 1
bench 100000 TB.PEEK 'l:__rand_int__' 1e6 0.001 3
bench 100000 TB.ADJUST 'l:__rand_int__' 1e6 0.001 -2
bench 100000 TB.ADJUST 'm:__rand_int__' 1e6 0.001 0.5

echo "soak: ${DURATION} s on port $PORT, $(nproc) cores; RSS sampled every ${INTERVAL} s"
printf '%6s %10s %12s %6s %9s %10s %14s\n' "t(s)" "rss(KB)" "used_memory" "frag" "keys" "ops/s" "commands"
SAMPLES=()
BASE=""
start=$(date +%s)
while :; do
  sleep "$INTERVAL"
  t=$(( $(date +%s) - start ))
  kill -0 "$SERVER_PID" 2>/dev/null || { echo "soak: server died"; tail -n 50 "$DIR/server.log"; exit 1; }
  rss=$(rss_kb)
  printf '%6s %10s %12s %6s %9s %10s %14s\n' "$t" "$rss" "$(info memory used_memory)" \
    "$(info memory allocator_frag_ratio)" "$(cli DBSIZE)" \
    "$(info stats instantaneous_ops_per_sec)" "$(info stats total_commands_processed)"
  if [ "$t" -ge "$WARMUP" ]; then
    [ -n "$BASE" ] || BASE=$rss
    SAMPLES+=("$rss")
  fi
  [ "$t" -ge "$DURATION" ] && break
done

for p in "${PIDS[@]:1}"; do kill "$p" 2>/dev/null || true; done
status=0
panics=$(info tb tb_panics)
errors=$(info tb tb_errors)
echo "soak: INFO tb: $(cli INFO tb | tr -d '\r' | grep '^tb_' | tr '\n' ' ')"
if [ "$panics" != 0 ] || [ "$errors" != 0 ]; then
  echo "soak: FAILED: $panics panics, $errors errors"
  status=1
fi
if grep -qi panic "$DIR/server.log"; then
  echo "soak: FAILED: panic in the server log"; status=1
fi
max=$BASE
for s in "${SAMPLES[@]}"; do [ "$s" -gt "$max" ] && max=$s; done
growth=$(python3 -c "print(f'{($max - $BASE) * 100 / $BASE:.2f}')")
echo "soak: RSS after warm-up ${BASE} KB, max ${max} KB: growth ${growth}% (limit ${MAX_GROWTH}%)"
if python3 -c "import sys; sys.exit(0 if ($max - $BASE) * 100 > $MAX_GROWTH * $BASE else 1)"; then
  echo "soak: FAILED: RSS grew more than ${MAX_GROWTH}%"
  status=1
fi
[ "$status" = 0 ] && echo "soak: passed"
exit $status
