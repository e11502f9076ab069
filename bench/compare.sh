#!/usr/bin/env bash
# Before/after throughput of two builds of the module, for the
# "Optimisations" section of docs/benchmarks.md:
#
#   bash bench/compare.sh OLD.so NEW.so [ROUNDS]
#
# One server per build (both pinned to core 0, only one busy at a time),
# redis-benchmark on core 1, runs alternating OLD/NEW so both see the same
# machine load; prints the median ops/s of each and the median of the
# per-round NEW/OLD ratios, in ops/s and in ops per second of server CPU
# time (steadier when other processes share the server's core). Cases: TB.CONSUME on new random keys, on 10,000
# existing buckets, and denied on a hot key, all at -c 50 -P 16.
set -euo pipefail

[ $# -ge 2 ] || { echo "usage: $0 OLD.so NEW.so [ROUNDS]" >&2; exit 2; }
OLD=$(realpath "$1")
NEW=$(realpath "$2")
ROUNDS=${3:-5}
N=${COMPARE_N:-400000}

SERVER=redis-server
# shellcheck source=bench/lib.sh
. "$(dirname "$0")/lib.sh"
bench_workdir tb-compare

declare -A PORTS SPIDS
for build in old new; do
  src=$OLD
  [ "$build" = new ] && src=$NEW
  cp "$src" "$WORK/$build.so"
  MODULE=$WORK/$build.so start_server "$build"
  PORTS[$build]=$PORT
  SPIDS[$build]=${PIDS[-1]}
done

# measure BUILD RANGE CMD...: "ops/s server-cpu-seconds" at -P 16.
measure() {
  local build=$1 range=$2
  shift 2
  PORT=${PORTS[$build]} SERVER_PID=${SPIDS[$build]} RANGE=$range rps 16 "$N" "$@"
}

RES=$WORK/results
: >"$RES"
for round in $(seq "$ROUNDS"); do
  for case in new-keys existing denied; do
    for build in old new; do
      p=${PORTS[$build]}
      case $case in
        new-keys)
          redis-cli -p "$p" FLUSHALL >/dev/null
          v=$(measure "$build" 1000000 TB.CONSUME rl:__rand_int__ 1000000 0.001 1)
          ;;
        existing)
          redis-cli -p "$p" FLUSHALL >/dev/null
          PORT=$p pipe_in tbbig 10000 'rl:%012d'
          v=$(measure "$build" 10000 TB.CONSUME rl:__rand_int__ 1000000 0.001 1)
          ;;
        denied)
          redis-cli -p "$p" TB.CONSUME rl:hot 1 0.0001 1 >/dev/null
          v=$(measure "$build" 1 TB.CONSUME rl:hot 1 0.0001 1)
          ;;
      esac
      read -r ops cpu <<<"$v"
      echo "$case $build $round $ops $cpu" >>"$RES"
      printf 'round %s  %-9s %-4s %12s ops/s  server cpu %ss\n' "$round" "$case" "$build" "$ops" "$cpu"
    done
  done
done

python3 - "$RES" "$N" <<'EOF'
import statistics, sys
n = int(sys.argv[2])
data = {}
for line in open(sys.argv[1]):
    case, build, rnd, ops, cpu = line.split()
    data.setdefault(case, {}).setdefault(build, {})[int(rnd)] = (float(ops), float(cpu))
print(f"\n{'case':10} {'old ops/s':>12} {'new ops/s':>12} {'new/old':>8} {'per CPU-s':>10}")
for case, d in data.items():
    old, new = d["old"], d["new"]
    both = [r for r in old if r in new]
    ratio = statistics.median(new[r][0] / old[r][0] for r in both)
    cpu = [(n / new[r][1]) / (n / old[r][1]) for r in both if new[r][1] and old[r][1]]
    print(f"{case:10} {statistics.median(v[0] for v in old.values()):12,.0f} "
          f"{statistics.median(v[0] for v in new.values()):12,.0f} {ratio:8.3f} "
          f"{statistics.median(cpu) if cpu else float('nan'):10.3f}")
EOF
