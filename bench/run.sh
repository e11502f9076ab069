#!/usr/bin/env bash
# `make bench`: throughput, memory per bucket, keyspace scale and
# instructions per command of the tb module, against plain HSET and the Lua
# library. Prints a table and writes docs/benchmarks.md (see bench/report.py).
#
# Only loopback; every server started here is killed on exit. About 6-10
# minutes on 2 cores. Knobs (environment):
#   BENCH_ROUNDS=5       interleaved rounds of the throughput cases (median)
#   BENCH_SCALE=1        multiplies every request count (0.2 for a smoke run)
#   BENCH_BIG=5000000    keys of the large keyspace of the scale case
#   BENCH_NO_DOC=1       print the table, leave docs/benchmarks.md alone
#   BENCH_SKIP=...       space-separated sections to skip: tput mem scale mcbig instr
#   BENCH_MODULE=path    another build of the module (before/after comparisons)
#   BENCH_SERVER=path    another server binary (e.g. the venv's valkey-server)
#   BENCH_OUT=dir        raw results (default target/bench)
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
MODULE=${BENCH_MODULE:-$ROOT/target/release/libredis_tokenbucket.so}
SERVER=${BENCH_SERVER:-redis-server}
LUA=$ROOT/lua/tb.lua
ROUNDS=${BENCH_ROUNDS:-5}
SCALE=${BENCH_SCALE:-1}
BIG=${BENCH_BIG:-5000000}
SKIP=" ${BENCH_SKIP:-} "
OUT=${BENCH_OUT:-$ROOT/target/bench}
RESULTS=$OUT/results.tsv

[ -f "$MODULE" ] || { echo "bench: $MODULE missing: run make build" >&2; exit 1; }
for tool in "$SERVER" redis-cli redis-benchmark python3; do
  command -v "$tool" >/dev/null || { echo "bench: $tool not found" >&2; exit 1; }
done

# shellcheck source=bench/lib.sh
. bench/lib.sh
bench_workdir tb-bench
# A private copy, so a rebuild during the run cannot change what is measured.
cp "$MODULE" "$WORK/tb.so"
MODULE=$WORK/tb.so

mkdir -p "$OUT"
: >"$RESULTS"
record() { printf '%s\n' "$(IFS=$'\t'; echo "$*")" >>"$RESULTS"; }

# stop_server PORT PID: SHUTDOWN and wait for the process to end.
stop_server() {
  redis-cli -p "$1" SHUTDOWN NOSAVE >/dev/null 2>&1 || true
  wait "$2" 2>/dev/null || true
}

rc() { redis-cli -p "$PORT" "$@"; }

load_lua() {
  [ -f "$LUA" ] && rc -x FUNCTION LOAD REPLACE <"$LUA" >/dev/null
}

n() { python3 -c "print(max(1000, int($1 * $SCALE)))"; }

# Throughput cases: name, requests at -P 16, requests at -P 1, setup, command.
# Counts are sized for about 3 s per run on the reference machine.
HOT="rl:hot"
CASES=(hset consume denied peek mconsume fcall)
# The random-key cases touch the same number of keys (TB.MCONSUME 3 per
# call), so their keyspaces end the same size.
declare -A N16=([hset]=600000 [consume]=600000 [denied]=600000 [peek]=600000 [mconsume]=200000 [fcall]=600000)
declare -A N1=([hset]=150000 [consume]=150000 [denied]=150000 [peek]=150000 [mconsume]=50000 [fcall]=150000)
declare -A CMD=(
  [hset]="HSET rl:__rand_int__ tokens 1.5 ts 1764513600123456"
  [consume]="TB.CONSUME rl:__rand_int__ 1000000 0.001 1"
  [denied]="TB.CONSUME $HOT 1 0.0001 1"
  [peek]="TB.PEEK $HOT 1 0.0001 1"
  [mconsume]="TB.MCONSUME rl:__rand_int__:a 1000000 0.001 1 rl:__rand_int__:b 1000000 0.001 1 rl:__rand_int__:c 1000000 0.001 1"
  [fcall]="FCALL tb_consume 1 rl:__rand_int__ 1000000 0.001 1"
)

{
  echo "started	$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "loadavg_start	$(cut -d' ' -f1-3 /proc/loadavg)"
  echo "nproc	$(nproc)"
  echo "cpu	$(lscpu | sed -n 's/^Model name: *//p' | head -1)"
  echo "kernel	$(uname -sr)"
  echo "redis	$("$SERVER" --version | sed 's/ server v=\([^ ]*\).*/ \1/')"
  echo "server_bin	$(command -v "$SERVER")"
  echo "rounds	$ROUNDS"
  echo "scale	$SCALE"
  echo "big	$BIG"
  echo "commit	$(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD -- src core 2>/dev/null || echo '+dirty')"
} >"$OUT/machine.tsv"

# ---- throughput -----------------------------------------------------------
if [[ $SKIP != *" tput "* ]]; then
  start_server main
  MAIN_PORT=$PORT
  SERVER_PID=${PIDS[-1]}
  if load_lua; then HAVE_LUA=1; else HAVE_LUA=0; fi
  # Within a round, every case at -P 16 first, then every case at -P 1:
  # the runs a ratio compares are close in time, so a neighbour's load on
  # this shared machine is more likely to hit both.
  for round in $(seq "$ROUNDS"); do
    for p in 16 1; do
      for case in "${CASES[@]}"; do
        if [ "$case" = fcall ] && [ "$HAVE_LUA" = 0 ]; then
          continue
        fi
        rc FLUSHALL >/dev/null
        if [ "$case" = denied ] || [ "$case" = peek ]; then
          # Drain the hot bucket: max 1 at 0.0001/s stays empty for hours.
          rc TB.CONSUME "$HOT" 1 0.0001 1 >/dev/null
        fi
        if [ "$p" = 16 ]; then count=$(n "${N16[$case]}"); else count=$(n "${N1[$case]}"); fi
        # shellcheck disable=SC2086 # CMD is split into words on purpose
        read -r v cpu < <(rps "$p" "$count" ${CMD[$case]})
        record tput "$case" "$p" "$round" "$v" "${cpu:-}" "$count"
        printf 'round %s  %-9s -P %-2s %12s ops/s  server cpu %ss\n' "$round" "$case" "$p" "$v" "${cpu:-?}"
      done
    done
  done
  rc FLUSHALL >/dev/null
fi

# ---- memory per bucket ----------------------------------------------------
if [[ $SKIP != *" mem "* ]]; then
  [ -n "${MAIN_PORT:-}" ] || { start_server main; MAIN_PORT=$PORT; load_lua || true; }
  PORT=$MAIN_PORT
  MEMN=1000000
  kinds=(tb plain)
  [ -f "$LUA" ] && kinds+=(fcall)
  for kind in "${kinds[@]}"; do
    rc FLUSHALL >/dev/null
    before=$(rc INFO memory | tr -d '\r' | sed -n 's/^used_memory://p')
    pipe_in "$kind" "$MEMN" 'rl:user:%07d' 1
    after=$(rc INFO memory | tr -d '\r' | sed -n 's/^used_memory://p')
    keys=$(rc DBSIZE)
    record mem "$kind" "$keys" "$before" "$after"
    printf 'memory  %-6s %8s keys  %6.1f bytes/bucket\n' "$kind" "$keys" \
      "$(python3 -c "print(($after - $before) / $keys)")"
  done
  rc FLUSHALL >/dev/null
fi

# ---- keyspace scale -------------------------------------------------------
# Two servers, one with 10,000 buckets and one with $BIG, so the runs can be
# interleaved. Keys match redis-benchmark's (rl: + 12 digits), so every call
# updates an existing bucket. HSET of the same keys runs too, as a control:
# what a larger keyspace costs Redis itself (it overwrites the two fields;
# the buckets stay valid and TB.CONSUME stays admitted).
if [[ $SKIP != *" scale "* ]]; then
  declare -A SCALE_PORT SCALE_PID
  for size in 10000 "$BIG"; do
    start_server "scale$size" --enable-debug-command local
    SCALE_PORT[$size]=$PORT
    SCALE_PID[$size]=${PIDS[-1]}
    pipe_in tbbig "$size" 'rl:%012d'
    # Let the incremental rehash of the keyspace and expires dicts finish,
    # so the big server's runs don't pay for it: the cron rehashes for 1 ms
    # a tick, so raise hz meanwhile (HTSTATS walks the tables: poll slowly).
    rc CONFIG SET hz 500 >/dev/null
    for _ in $(seq 120); do
      [[ $(rc DEBUG HTSTATS 0) == *"rehashing target"* ]] || break
      sleep 2
    done
    rc CONFIG SET hz 10 >/dev/null
  done
  for round in $(seq "$ROUNDS"); do
    for case in consume hset; do
      for size in 10000 "$BIG"; do
        PORT=${SCALE_PORT[$size]}
        SERVER_PID=${SCALE_PID[$size]}
        count=$(n 600000)
        # shellcheck disable=SC2086
        read -r v cpu < <(RANGE=$size rps 16 "$count" ${CMD[$case]})
        record scale "$size" "$case" "$round" "$v" "${cpu:-}" "$count"
        printf 'round %s  scale %-8s %-8s -P 16 %12s ops/s  server cpu %ss\n' "$round" "$size" "$case" "$v" "${cpu:-?}"
      done
    done
  done
fi

# ---- one large TB.MCONSUME -----------------------------------------------
# Server time per call (INFO commandstats: the command alone, without
# reading the request or writing the reply) of TB.MCONSUME with 10,000
# groups, the most it takes, on new keys; and of TB.CONSUME on new keys in
# the same server, for scale. Nothing else runs on that server meanwhile.
# The server's CPU seconds over each batch are the steadier figure on a
# shared machine (commandstats counts wall time, descheduled time too).
if [[ $SKIP != *" mcbig "* ]]; then
  start_server mcbig
  SERVER_PID=${PIDS[-1]}
  MCBIG_CALLS=$(python3 -c "print(max(5, int(20 * $SCALE)))")
  rc CONFIG RESETSTAT >/dev/null
  declare -A MCBIG_CPU
  for cmd in tb.mconsume tb.consume; do
    t0=$(server_ticks)
    if [ "$cmd" = tb.mconsume ]; then
      pipe_in mcbig "$MCBIG_CALLS" 'rl:m:%012d'
    else
      pipe_in tbbig "$((MCBIG_CALLS * 10000))" 'rl:c:%012d'
    fi
    t1=$(server_ticks)
    MCBIG_CPU[$cmd]=$(python3 -c "print(($t1 - $t0) / $TICK)")
  done
  stats=$(rc INFO commandstats | tr -d '\r')
  for cmd in tb.mconsume tb.consume; do
    line=$(sed -n "s/^cmdstat_$cmd:\(calls=[0-9]*,usec=[0-9]*\).*/\1/p" <<<"$stats")
    calls=$(sed 's/calls=\([0-9]*\),.*/\1/' <<<"$line")
    usec=$(sed 's/.*usec=\([0-9]*\)/\1/' <<<"$line")
    groups=1
    [ "$cmd" = tb.mconsume ] && groups=10000
    record mcbig "$cmd" "$groups" "$calls" "$usec" "${MCBIG_CPU[$cmd]}"
    printf 'mcbig  %-12s %6s calls  %12s us  server cpu %ss\n' "$cmd" "$calls" "$usec" "${MCBIG_CPU[$cmd]}"
  done
  stop_server "$PORT" "$SERVER_PID"
  SERVER_PID=
fi

# ---- instructions per command (callgrind) ---------------------------------
# Each case runs on a fresh server under callgrind twice, with N and 2N
# commands; (cost(2N) - cost(N)) / N cancels start-up and shutdown. The
# commands come from bench/gen.py through redis-cli --pipe, with keys drawn
# by a fixed seed, so both runs see the same stream (redis-benchmark's
# unseeded keys made the figures vary by ~3% between runs). Two figures:
# inside call() (the command proper) and the whole process (also reading,
# parsing and writing).
if [[ $SKIP != *" instr "* ]] && command -v valgrind >/dev/null; then
  IN=$(n 20000)
  cases=(hset consume update denied)
  # FCALL: whole server only, as call() recurses through redis.call.
  [ -f "$LUA" ] && cases+=(fcall)
  for case in "${cases[@]}"; do
    for mult in 1 2; do
      cg=$OUT/callgrind.$case.$mult.out
      WRAP="valgrind --tool=callgrind --callgrind-out-file=$cg" start_server "cg$case$mult"
      count=$((IN * mult))
      case $case in
        hset) pipe_in hset "$count" 'rl:%012d' rand:1000000 ;;
        consume) pipe_in tbbig "$count" 'rl:%012d' rand:1000000 ;;
        fcall)
          load_lua
          pipe_in fcallbig "$count" 'rl:%012d' rand:1000000
          ;;
        update)
          # TB.CONSUME on 10,000 existing buckets, as in the scale case.
          pipe_in tbbig 10000 'rl:%012d'
          pipe_in tbbig "$count" 'rl:%012d' rand:10000
          ;;
        denied)
          rc TB.CONSUME "$HOT" 1 0.0001 1 >/dev/null
          pipe_in tbhot "$count" "$HOT"
          ;;
      esac
      stop_server "$PORT" "${PIDS[-1]}"
      read -r total incall < <(callgrind_annotate --inclusive=yes "$cg" 2>/dev/null | awk '
        / PROGRAM TOTALS/ { gsub(",", "", $1); t = $1 }
        /\?\?\?:call \[/ { gsub(",", "", $1); c = $1 }
        END { print t, c }')
      record instr "$case" "$count" "$total" "$incall"
      # Where TB.CONSUME's cost goes: the module API functions it calls
      # (Redis's own code) and its handler, inclusive. Valkey spells the
      # API `VM_`; --threshold=100 lists every function.
      if [ "$case" = consume ] || [ "$case" = update ]; then
        callgrind_annotate --inclusive=yes --threshold=100 "$cg" 2>/dev/null | awk -v c="$case" -v n="$count" '
          match($0, /\?\?\?:[^ ]+ \[/) {
            f = substr($0, RSTART + 4, RLENGTH - 6)
            sub(/^(RM|VM)_/, "", f)
            sub(/^(Redis|Valkey)ModuleCommandDispatcher$/, "Dispatcher", f)
            sub(/^redis_tokenbucket::commands::consume$/, "handler", f)
            if (f ~ /^(HashSet|HashGet|Replicate|SetAbsExpire|ReplyWithArray|ReplyWithLongLong|OpenKey|CloseKey|CreateString|FreeString|SignalModifiedKey|NotifyKeyspaceEvent|Dispatcher|handler)$/) {
              gsub(",", "", $1)
              printf "fn\t%s\t%s\t%s\t%s\n", c, n, f, $1
            }
          }' >>"$RESULTS"
      fi
      printf 'callgrind %-8s n=%-6s total %14s  in call() %14s\n' "$case" "$count" "$total" "$incall"
    done
  done
fi

echo "loadavg_end	$(cut -d' ' -f1-3 /proc/loadavg)" >>"$OUT/machine.tsv"

if [ -n "${BENCH_NO_DOC:-}" ]; then
  python3 bench/report.py "$OUT"
else
  python3 bench/report.py "$OUT" "$ROOT/docs/benchmarks.md"
fi
