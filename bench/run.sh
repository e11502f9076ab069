#!/usr/bin/env bash
# `make bench`: throughput, memory per bucket, keyspace scale and
# instructions per command of the tb module, against plain HSET, redis-cell's
# CL.THROTTLE (when given), the Lua library and a bare Lua token bucket
# (bench/bare.lua). Prints a table and writes docs/benchmarks.md (see
# bench/report.py).
#
# Only loopback; every server started here is killed on exit. About 15-20
# minutes on 2 cores. Knobs (environment):
#   BENCH_ROUNDS=5       interleaved rounds of the throughput cases (median)
#   BENCH_SCALE=1        multiplies every request count (0.2 for a smoke run)
#   BENCH_BIG="5000000 10000000"  keys of the large keyspaces of the scale
#                        case (a size is left out when memory is short)
#   BENCH_NO_DOC=1       print the table, leave docs/benchmarks.md alone
#   BENCH_SKIP=...       space-separated sections to skip: tput mem scale mcbig instr
#   BENCH_INSTR=...      the instruction cases to run (default: all; names
#                        as in INSTR_CASES below)
#   BENCH_INSTR_SERVERS=3  callgrind servers per instruction case (median)
#   BENCH_CELL_SO=path   redis-cell's libredis_cell.so: every server loads it
#                        first, so CL.THROTTLE is redis-cell's, and the
#                        CL.THROTTLE rows run (docs/benchmarks.md says how to
#                        build it); without it the report says they did not
#   BENCH_MODULE=path    another build of the module (before/after comparisons)
#   BENCH_SERVER=path    another server binary (e.g. the venv's valkey-server)
#   BENCH_OUT=dir        raw results (default target/bench)
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
MODULE=${BENCH_MODULE:-$ROOT/target/release/libredis_tokenbucket.so}
SERVER=${BENCH_SERVER:-redis-server}
LUA=$ROOT/lua/tb.lua
BARE=$ROOT/bench/bare.lua
CELL_SO=${BENCH_CELL_SO:-}
ROUNDS=${BENCH_ROUNDS:-5}
SCALE=${BENCH_SCALE:-1}
BIG=${BENCH_BIG:-5000000 10000000}
SKIP=" ${BENCH_SKIP:-} "
OUT=${BENCH_OUT:-$ROOT/target/bench}
RESULTS=$OUT/results.tsv

[ -f "$MODULE" ] || { echo "bench: $MODULE missing: run make build" >&2; exit 1; }
if [ -n "$CELL_SO" ] && [ ! -f "$CELL_SO" ]; then
  echo "bench: BENCH_CELL_SO=$CELL_SO: no such file" >&2
  exit 1
fi
for tool in "$SERVER" redis-cli redis-benchmark python3; do
  command -v "$tool" >/dev/null || { echo "bench: $tool not found" >&2; exit 1; }
done

# shellcheck source=bench/lib.sh
. bench/lib.sh
bench_workdir tb-bench
# A private copy, so a rebuild during the run cannot change what is measured.
cp "$MODULE" "$WORK/tb.so"
MODULE=$WORK/tb.so
if [ -n "$CELL_SO" ]; then
  cp "$CELL_SO" "$WORK/cell.so"
  CELL_SO=$WORK/cell.so
fi
# The EVAL forms: the library's (lua/gen_eval.py) and the bare recipe's.
python3 lua/gen_eval.py "$WORK/tb-eval.lua"
sed '1d; s/^redis.register_function.*$/return bare_consume(KEYS, ARGV)/' "$BARE" >"$WORK/bare-eval.lua"

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
  rc -x FUNCTION LOAD REPLACE <"$LUA" >/dev/null && rc -x FUNCTION LOAD REPLACE <"$BARE" >/dev/null
}

# The SHA1 of the script FILE, loaded into the server at PORT.
load_script() {
  rc -x SCRIPT LOAD <"$1"
}

n() { python3 -c "print(max(1000, int($1 * $SCALE)))"; }

# Throughput cases: name, requests at -P 16, requests at -P 1, setup, command.
# Counts are sized for about 3 s per run on the reference machine.
HOT="rl:hot"
CASES=(hset consume denied peek mconsume fcall bare)
# redis-cell's rows, on the same buckets: capacity max_burst + 1, refill
# count / period per second.
[ -n "$CELL_SO" ] && CASES+=(cell celldenied)
# The random-key cases touch the same number of keys (TB.MCONSUME 3 per
# call), so their keyspaces end the same size.
declare -A N16=([hset]=600000 [consume]=600000 [denied]=600000 [peek]=600000 [mconsume]=200000
  [fcall]=600000 [bare]=600000 [cell]=600000 [celldenied]=600000)
declare -A N1=([hset]=150000 [consume]=150000 [denied]=150000 [peek]=150000 [mconsume]=50000
  [fcall]=150000 [bare]=150000 [cell]=150000 [celldenied]=150000)
declare -A CMD=(
  [hset]="HSET rl:__rand_int__ tokens 1.5 ts 1764513600123456"
  [consume]="TB.CONSUME rl:__rand_int__ 1000000 0.001 1"
  [denied]="TB.CONSUME $HOT 1 0.0001 1"
  [peek]="TB.PEEK $HOT 1 0.0001 1"
  [mconsume]="TB.MCONSUME rl:__rand_int__:a 1000000 0.001 1 rl:__rand_int__:b 1000000 0.001 1 rl:__rand_int__:c 1000000 0.001 1"
  [fcall]="FCALL tb_consume 1 rl:__rand_int__ 1000000 0.001 1"
  [bare]="FCALL bare_consume 1 rl:__rand_int__ 1000000 0.001 1"
  [cell]="CL.THROTTLE rl:__rand_int__ 999999 1 1000 1"
  [celldenied]="CL.THROTTLE $HOT 0 1 10000 1"
)
# What drains the hot key of a denied case first (the bucket holds 1).
declare -A DRAIN=(
  [denied]="TB.CONSUME $HOT 1 0.0001 1"
  [peek]="TB.CONSUME $HOT 1 0.0001 1"
  [celldenied]="CL.THROTTLE $HOT 0 1 10000 1"
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
  echo "cell	${BENCH_CELL_SO:-}"
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
        if [[ $case == fcall || $case == bare ]] && [ "$HAVE_LUA" = 0 ]; then
          continue
        fi
        rc FLUSHALL >/dev/null
        if [ -n "${DRAIN[$case]:-}" ]; then
          # Drain the hot bucket: max 1 at 0.0001/s stays empty for hours.
          # shellcheck disable=SC2086
          rc ${DRAIN[$case]} >/dev/null
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
# One server per size, 10,000 buckets and each of $BIG, so the runs can be
# interleaved. Keys match redis-benchmark's (rl: + 12 digits), so every call
# updates an existing bucket. HSET of the same keys runs too, as a control:
# what a larger keyspace costs Redis itself (it overwrites the two fields;
# the buckets stay valid and TB.CONSUME stays admitted).
if [[ $SKIP != *" scale "* ]]; then
  declare -A SCALE_PORT SCALE_PID
  # A size is left out unless the machine has room for it and the sizes
  # before it: about 200 bytes a bucket in used_memory, 400 with the
  # allocator's and the fill's slack.
  avail_kb=$(awk '/^MemAvailable:/ { print $2 }' /proc/meminfo)
  sizes=(10000)
  need=0
  for size in $BIG; do
    need=$((need + size * 400 / 1024))
    if [ "$need" -lt "$avail_kb" ]; then
      sizes+=("$size")
    else
      echo "scale: $size keys left out (needs ~$((need / 1024)) MiB, $((avail_kb / 1024)) MiB available)"
      record scale_skipped "$size" "$((avail_kb / 1024))"
    fi
  done
  for size in "${sizes[@]}"; do
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
      for size in "${sizes[@]}"; do
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
  # Free the memory before the callgrind runs.
  for size in "${sizes[@]}"; do
    stop_server "${SCALE_PORT[$size]}" "${SCALE_PID[$size]}"
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
# Each case runs on fresh servers under callgrind ($INSTR_SERVERS of them;
# the report takes the median). Callgrind dumps its counts at each DBSIZE
# (--dump-before=dbsizeCommand): one after start-up and the case's setup,
# one after the N measured commands, so the second dump holds just those.
# The commands come from bench/gen.py through redis-cli --pipe, with keys
# drawn by a fixed seed, so every server sees the same stream. Two figures:
# inside call() (the command proper) and the whole process (also reading,
# parsing and writing) less serverCron, the timer, which runs on wall time
# (a slower run under valgrind, or a busier machine, would charge the
# commands more of it). What still differs between servers is mostly the
# random seed of Redis's dict hash: how long a chain a command-table lookup
# walks (the client's command, and each RM_Replicate's), hence the median.
# --activerehashing no: a growing keyspace is rehashed in steps of the
# commands that touch it, not for a millisecond of wall time per tick.
#
# Cases: new keys (random over 1,000,000), existing buckets (10,000 made
# first, then random over them) and a drained hot key, for TB.CONSUME, for
# redis-cell's CL.THROTTLE (BENCH_CELL_SO), for the Lua library's
# tb_consume through FCALL and through EVALSHA, and for the bare recipe
# (bench/bare.lua) through both; and TB.QUOTA (a monthly quota, the
# calendar's longest step) on new and existing keys; and a reservation
# (TB.CONSUME ... WAIT) on a hot key.
INSTR_SERVERS=${BENCH_INSTR_SERVERS:-3}
INSTR_CASES=(hset consume update denied)
[ -n "$CELL_SO" ] && INSTR_CASES+=(cell cellupdate celldenied)
INSTR_CASES+=(fcall fcallupdate bare bareupdate eval bareeval quota quotaupdate reserve)
FCALL_ARGS="1000000 0.001 1"
# instr_case CASE setup|run COUNT: what CASE needs first, or its COUNT
# measured commands.
instr_case() {
  local case=$1 phase=$2 count=$3 keys='rl:%012d' range=1000000 words=() sha
  case $case in
    hset) words=(HSET KEY tokens 1.5 ts 1764513600123456) ;;
    consume | update) words=(TB.CONSUME KEY $FCALL_ARGS) ;;
    denied) words=(TB.CONSUME KEY 1 0.0001 1) keys=$HOT ;;
    quota | quotaupdate) words=(TB.QUOTA KEY 1000000 MONTH 1) ;;
    # A drained hot bucket that refills too slowly to matter: every call a
    # reservation, deeper in debt (the floor is far).
    reserve) words=(TB.CONSUME KEY 1e6 0.001 1 WAIT 100000000000000) keys=$HOT ;;
    cell | cellupdate) words=(CL.THROTTLE KEY 999999 1 1000 1) ;;
    celldenied) words=(CL.THROTTLE KEY 0 1 10000 1) keys=$HOT ;;
    fcall | fcallupdate) words=(FCALL tb_consume 1 KEY $FCALL_ARGS) ;;
    bare | bareupdate) words=(FCALL bare_consume 1 KEY $FCALL_ARGS) ;;
    eval) words=(EVALSHA @tb-eval 1 KEY consume $FCALL_ARGS) ;;
    bareeval) words=(EVALSHA @bare-eval 1 KEY $FCALL_ARGS) ;;
    *) echo "bench: unknown instruction case $case" >&2; exit 1 ;;
  esac
  [[ $case == *update ]] && range=10000
  if [ "$phase" = setup ]; then
    [[ $case == fcall* || $case == bare* ]] && load_lua
    if [[ ${words[1]} == @* ]]; then
      sha=$(load_script "$WORK/${words[1]#@}.lua")
      echo "$sha" >"$WORK/sha"
    fi
    if [[ $case == *update ]]; then
      pipe_in cmd 10000 "$keys" -- "${words[@]}"
    elif [[ $case == reserve ]]; then
      pipe_in cmd 1 "$keys" -- TB.CONSUME KEY 1e6 0.001 1e6
    elif [[ $keys == "$HOT" ]]; then
      # Drain the hot bucket (it holds 1).
      pipe_in cmd 1 "$keys" -- "${words[@]}"
    fi
    return
  fi
  [[ ${words[1]} == @* ]] && words[1]=$(cat "$WORK/sha")
  if [[ $keys == "$HOT" ]]; then
    pipe_in cmd "$count" "$keys" -- "${words[@]}"
  else
    pipe_in cmd "$count" "$keys" "rand:$range" -- "${words[@]}"
  fi
}
if [[ $SKIP != *" instr "* ]] && command -v valgrind >/dev/null; then
  IN=$(n 20000)
  # shellcheck disable=SC2068 # the default list is split into words
  for case in ${BENCH_INSTR:-${INSTR_CASES[@]}}; do
    for server in $(seq "$INSTR_SERVERS"); do
      cg=$OUT/callgrind.$case.$server.out
      rm -f "$cg" "$cg".*
      WRAP="valgrind --tool=callgrind --callgrind-out-file=$cg --dump-before=dbsizeCommand" \
        start_server "cg$case$server" --activerehashing no
      instr_case "$case" setup "$IN"
      rc DBSIZE >/dev/null
      instr_case "$case" run "$IN"
      rc DBSIZE >/dev/null
      stop_server "$PORT" "${PIDS[-1]}"
      # The second dump: the measured commands.
      mv "$cg.2" "$cg"
      rm -f "$cg".*
      read -r total incall cron < <(callgrind_annotate --inclusive=yes "$cg" 2>/dev/null | awk '
        / PROGRAM TOTALS/ { gsub(",", "", $1); t = $1 }
        /\?\?\?:call \[/ { gsub(",", "", $1); c = $1 }
        /\?\?\?:serverCron \[/ { gsub(",", "", $1); s = $1 }
        END { print t, c, s + 0 }')
      record instr "$case" "$server" "$IN" "$((total - cron))" "$incall"
      # Where TB.CONSUME's cost goes: the module API functions it calls
      # (Redis's own code) and its handler, inclusive. Valkey spells the
      # API `VM_`; --threshold=100 lists every function.
      if [ "$case" = consume ] || [ "$case" = update ]; then
        callgrind_annotate --inclusive=yes --threshold=100 "$cg" 2>/dev/null | awk -v c="$case" -v s="$server" -v n="$IN" '
          match($0, /\?\?\?:[^ ]+ \[/) {
            f = substr($0, RSTART + 4, RLENGTH - 6)
            sub(/^(RM|VM)_/, "", f)
            sub(/^(Redis|Valkey)ModuleCommandDispatcher$/, "Dispatcher", f)
            sub(/^redis_tokenbucket::commands::consume$/, "handler", f)
            if (f ~ /^(HashSet|HashGet|Replicate|SetAbsExpire|ReplyWithArray|ReplyWithLongLong|OpenKey|CloseKey|CreateString|FreeString|SignalModifiedKey|NotifyKeyspaceEvent|StringPtrLen|KeyType|ValueLength|Dispatcher|handler)$/) {
              gsub(",", "", $1)
              printf "fn\t%s\t%s\t%s\t%s\t%s\n", c, s, n, f, $1
            }
          }' >>"$RESULTS"
      fi
      printf 'callgrind %-11s server %s  per command: whole %8.0f  in call() %8.0f\n' \
        "$case" "$server" "$(((total - cron) / IN))" "$((incall / IN))"
    done
  done
fi

echo "loadavg_end	$(cut -d' ' -f1-3 /proc/loadavg)" >>"$OUT/machine.tsv"

if [ -n "${BENCH_NO_DOC:-}" ]; then
  python3 bench/report.py "$OUT"
else
  python3 bench/report.py "$OUT" "$ROOT/docs/benchmarks.md"
fi
