# Helpers shared by bench/run.sh and bench/compare.sh; sourced, not run.
#
# After `bench_workdir PREFIX`: WORK (a temporary directory) and PIDS (every
# server started; all killed, and WORK removed, on exit). start_server reads
# SERVER, MODULE, CELL_SO (redis-cell, loaded before MODULE when set) and
# WRAP (a command line to run the server under); rps reads PORT, SERVER_PID
# and RANGE.

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

# Server on the first core, redis-benchmark on the second, so they do not
# share a core (with one core, nothing is pinned).
if [ "$(nproc)" -ge 2 ]; then
  SRV=(taskset -c 0)
  CLI=(taskset -c 1)
else
  SRV=()
  CLI=()
fi

cleanup() {
  for pid in "${PIDS[@]}"; do
    kill "$pid" 2>/dev/null || true
  done
  for pid in "${PIDS[@]}"; do
    wait "$pid" 2>/dev/null || true
  done
  rm -rf "$WORK"
}

# bench_workdir PREFIX: creates WORK and sets the traps that clean up.
bench_workdir() {
  WORK=$(mktemp -d "${TMPDIR:-/tmp}/$1.XXXXXX")
  PIDS=()
  trap cleanup EXIT
  trap 'exit 130' INT TERM
}

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# start_server NAME [server args...]: sets PORT; the server's pid goes to PIDS.
# Waits for PING (valgrind'ed servers take a few seconds).
start_server() {
  local name=$1
  shift
  PORT=$(free_port)
  mkdir -p "$WORK/$name"
  "${SRV[@]}" ${WRAP:-} "$SERVER" --bind 127.0.0.1 --port "$PORT" --save '' \
    --appendonly no --dir "$WORK/$name" --logfile "$WORK/$name/server.log" \
    ${CELL_SO:+--loadmodule "$CELL_SO"} --loadmodule "$MODULE" "$@" >"$WORK/$name/stdout.log" 2>&1 &
  PIDS+=($!)
  for _ in $(seq 600); do
    redis-cli -p "$PORT" PING 2>/dev/null | grep -q PONG && return 0
    kill -0 "${PIDS[-1]}" 2>/dev/null || break
    sleep 0.1
  done
  echo "bench: server $name did not start; log:" >&2
  cat "$WORK/$name/server.log" >&2 || true
  exit 1
}

# pipe_in KIND COUNT KEYFMT [FIRST | rand:RANGE]: sends bench/gen.py's
# commands (e.g. COUNT buckets) to PORT through redis-cli --pipe.
pipe_in() {
  local out
  out=$(python3 "$BENCH_DIR/gen.py" "$@" | redis-cli -p "$PORT" --pipe 2>&1)
  if ! grep -q "errors: 0," <<<"$out"; then
    echo "bench: redis-cli --pipe failed: $out" >&2
    exit 1
  fi
}

# rps P N CMD...: ops/s of one redis-benchmark run (50 clients, random keys
# over RANGE) and the server's CPU seconds meanwhile (SERVER_PID; empty if
# unknown). Other processes on a shared machine take turns on the server's
# core, so ops per server CPU second is the steadier figure.
TICK=$(getconf CLK_TCK)
server_ticks() {
  [ -n "${SERVER_PID:-}" ] && awk '{ print $14 + $15 }' "/proc/$SERVER_PID/stat" 2>/dev/null || echo ""
}
rps() {
  local p=$1 count=$2 t0 t1 ops
  shift 2
  t0=$(server_ticks)
  ops=$("${CLI[@]}" redis-benchmark -h 127.0.0.1 -p "$PORT" -c 50 -P "$p" -r "${RANGE:-1000000}" \
    -n "$count" --csv "$@" | awk -F'"' 'NR == 2 { print $4 }')
  t1=$(server_ticks)
  if [ -n "$t0" ] && [ -n "$t1" ]; then
    echo "$ops $(python3 -c "print(($t1 - $t0) / $TICK)")"
  else
    echo "$ops"
  fi
}
