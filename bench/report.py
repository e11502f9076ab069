#!/usr/bin/env python3
"""Turns bench/run.sh's raw results into a table, and docs/benchmarks.md.

    report.py OUTDIR [DOC]

OUTDIR holds machine.tsv and results.tsv. Without DOC, only prints. The
"Optimisations" section of the document is bench/optimisations.md, kept by
hand (before/after figures of each change), included as it is.
"""

import statistics
import sys
from collections import defaultdict
from pathlib import Path

CASES = [
    ("hset", "HSET key tokens 1.5 ts 1764513600123456 (ceiling)"),
    ("consume", "TB.CONSUME admitted, random keys"),
    ("denied", "TB.CONSUME denied, one hot key"),
    ("peek", "TB.PEEK, one hot key"),
    ("mconsume", "TB.MCONSUME, 3 random buckets"),
    ("fcall", "FCALL tb_consume (Lua), random keys"),
]


def load(outdir: Path):
    machine = {}
    for line in (outdir / "machine.tsv").read_text().splitlines():
        k, _, v = line.partition("\t")
        machine[k] = v
    # (case, P) or (case, size) -> {round: ops/s}, and the same in ops per
    # second of server CPU time (when the run recorded the server's CPU).
    tput, tput_cpu = defaultdict(dict), defaultdict(dict)
    scale, scale_cpu = defaultdict(dict), defaultdict(dict)
    mem = {}  # kind -> (keys, before, after)
    instr = {}  # (case, n) -> (total, in_call)
    fns = defaultdict(dict)  # (case, n) -> {API function or "handler": inclusive}
    for line in (outdir / "results.tsv").read_text().splitlines():
        f = line.split("\t")
        try:
            if f[0] in ("tput", "scale") and f[4]:
                if f[0] == "tput":
                    key, into, into_cpu = (f[1], int(f[2])), tput, tput_cpu
                else:
                    key, into, into_cpu = (f[2], int(f[1])), scale, scale_cpu
                into[key][int(f[3])] = float(f[4])
                if len(f) > 6 and f[5] and float(f[5]) > 0:
                    into_cpu[key][int(f[3])] = int(f[6]) / float(f[5])
            elif f[0] == "mem":
                mem[f[1]] = (int(f[2]), int(f[3]), int(f[4]))
            elif f[0] == "instr" and f[3] and f[4]:
                instr[(f[1], int(f[2]))] = (int(f[3]), int(f[4]))
            elif f[0] == "fn":
                fns[(f[1], int(f[2]))][f[3]] = int(f[4])
        except (IndexError, ValueError):
            print(f"report: skipping malformed line {line!r}", file=sys.stderr)
    return machine, (tput, tput_cpu), (scale, scale_cpu), mem, (instr, fns)


def med(xs):
    return statistics.median(xs) if xs else None


def ratio(a, b):
    return a / b if a is not None and b else None


def fmt_ops(v):
    return "n/a" if v is None else f"{v:,.0f}"


def fmt_x(v):
    return "n/a" if v is None else f"{v:.2f}x"


def per_command(table, case, value):
    """value(entry) per command, from the N and 2N runs of `case` in
    `table`: (cost(2N) - cost(N)) / N cancels start-up and shutdown."""
    runs = sorted(n for (c, n) in table if c == case)
    if len(runs) < 2:
        return None
    n1, n2 = runs[0], runs[-1]
    return (value(table[(case, n2)]) - value(table[(case, n1)])) / (n2 - n1)


def paired(a, b):
    """Median over rounds of a/b in the same round: a load that drifts
    during the run shifts both runs of a round alike."""
    return med([a[r] / b[r] for r in a if r in b and b[r]])


def build(outdir: Path):
    machine, (tput, tput_cpu), (scale, scale_cpu), mem, (instr, fns) = load(outdir)
    m = {k: med(list(v.values())) for k, v in tput.items()}
    rounds = max((len(v) for v in tput.values()), default=0)

    def vs(case, other, p, src=tput):
        return paired(src.get((case, p), {}), src.get((other, p), {}))

    tables = {}
    rows = []
    for case, label in CASES:
        p16, p1 = m.get((case, 16)), m.get((case, 1))
        rows.append([label, fmt_ops(p16), fmt_ops(p1), fmt_x(vs(case, "hset", 16)),
                     fmt_x(vs(case, "hset", 1)), fmt_x(vs(case, "hset", 16, tput_cpu)),
                     fmt_x(vs(case, "hset", 1, tput_cpu))])
    tables["Throughput"] = (
        ["case", "ops/s -P 16", "ops/s -P 1", "/ HSET -P 16", "/ HSET -P 1",
         "per CPU-s / HSET -P 16", "per CPU-s / HSET -P 1"],
        rows,
    )

    per_bucket = {}
    rows = []
    for kind, label in [
        ("tb", "TB.CONSUME (module)"),
        ("plain", "HSET + PEXPIREAT (no module)"),
        ("fcall", "FCALL tb_consume (Lua)"),
    ]:
        if kind in mem:
            keys, before, after = mem[kind]
            per_bucket[kind] = (after - before) / keys if keys else None
            rows.append([label, f"{keys:,}", f"{after - before:,}", f"{per_bucket[kind]:.1f}"])
    tables["Memory"] = (["written by", "keys", "used_memory delta", "bytes/bucket"], rows)

    sizes = sorted({size for (_, size) in scale})

    def scale_vs(case, src=scale):
        if len(sizes) < 2:
            return None
        return paired(src.get((case, sizes[-1]), {}), src.get((case, sizes[0]), {}))

    scale_ratio = scale_vs("consume")
    rows = []
    for case, label in [("consume", "TB.CONSUME"), ("hset", "HSET (control)")]:
        if any(c == case for (c, _) in scale):
            rows.append([label] + [fmt_ops(med(list(scale.get((case, size), {}).values())))
                                   for size in sizes]
                        + [fmt_x(scale_vs(case)), fmt_x(scale_vs(case, scale_cpu))])
    tables["Scale"] = (["-P 16, existing keys"] + [f"{size:,} keys" for size in sizes]
                       + ([f"{sizes[-1]:,} / {sizes[0]:,}", "per CPU-s"]
                          if len(sizes) > 1 else []), rows)

    # (in call(), whole process) instructions per command.
    ic = {case: (per_command(instr, case, lambda e: e[1]),
                 per_command(instr, case, lambda e: e[0]))
          for case in ("hset", "consume", "update", "denied", "fcall")}
    rows = []
    for case, label in [
        ("hset", "HSET"),
        ("consume", "TB.CONSUME admitted, random keys"),
        ("update", "TB.CONSUME admitted, 10,000 existing buckets"),
        ("denied", "TB.CONSUME denied, hot key"),
        ("fcall", "FCALL tb_consume, random keys"),
    ]:
        incall, whole = ic[case]
        if case == "fcall":
            if whole is None:
                continue
            incall = None  # call() recurses through redis.call: not comparable
        rows.append(
            [
                label,
                "n/a" if incall is None else f"{incall:,.0f}",
                "n/a" if whole is None else f"{whole:,.0f}",
            ]
        )
    i_ratio = ratio(ic["consume"][0], ic["hset"][0])
    w_ratio = ratio(ic["consume"][1], ic["hset"][1])
    rows.append(["TB.CONSUME random keys / HSET", fmt_x(i_ratio), fmt_x(w_ratio)])
    if ic["fcall"][1] is not None:
        rows.append(["FCALL / TB.CONSUME random keys", "n/a",
                     fmt_x(ratio(ic["fcall"][1], ic["consume"][1]))])
    tables["Instructions"] = (
        ["command", "instructions in call()", "instructions, whole server"],
        rows,
    )

    # Where TB.CONSUME's instructions in call() go, per command: each module
    # API function it calls (Redis's code, inclusive), the module context
    # and call()'s own bookkeeping, and what is left: the module's code.
    parts = [
        ("RM_HashSet: the two fields (HSET's own work)", ["HashSet"]),
        ("RM_HashGet: reading the stored bucket", ["HashGet"]),
        ("RM_Replicate x2: HSET + PEXPIREAT as effects", ["Replicate"]),
        ("RM_SetAbsExpire: the TTL", ["SetAbsExpire"]),
        ("RM_OpenKey + RM_CloseKey", ["OpenKey", "CloseKey"]),
        ("RM_CreateString + RM_FreeString: values for HashSet/Replicate",
         ["CreateString", "FreeString"]),
        ("RM_ReplyWithArray + RM_ReplyWithLongLong x4", ["ReplyWithArray", "ReplyWithLongLong"]),
        ("RM_SignalModifiedKey + RM_NotifyKeyspaceEvent x2",
         ["SignalModifiedKey", "NotifyKeyspaceEvent"]),
    ]

    def per_fn(case, name):
        return per_command(fns, case, lambda e: e.get(name, 0))

    floor = {}
    columns = {}
    for case in ("consume", "update"):
        handler, incall = per_fn(case, "handler"), ic[case][0]
        if handler is None or incall is None:
            continue
        api = [sum(per_fn(case, n) or 0 for n in names) for _, names in parts]
        redis_side = sum(api) + incall - handler
        floor[case] = redis_side
        columns[case] = api + [incall - handler, redis_side, handler - sum(api), incall]
    rows = []
    if columns:
        labels = [label for label, _ in parts] + [
            "module context and call() bookkeeping",
            "**Redis's side, total**",
            "the module's own code (parsing, arithmetic, encoding)",
            "**in call()**",
        ]
        for i, label in enumerate(labels):
            rows.append([label] + [f"{columns[c][i]:,.0f}" if c in columns else "n/a"
                                   for c in ("consume", "update")])
        rows.append(["Redis's side alone / HSET in call()"]
                    + [fmt_x(ratio(floor.get(c), ic["hset"][0])) for c in ("consume", "update")])
    tables["Breakdown"] = (["TB.CONSUME, per command", "new keys", "existing buckets"], rows)

    def target(name, value, goal, ok, shown, cpu=None):
        status = "n/a" if value is None else ("PASS" if ok(value) else "MISS")
        return [name, goal, shown(value) if value is not None else "n/a", status,
                fmt_x(cpu) if cpu is not None else ""]

    targets = [
        target("TB.CONSUME admitted vs HSET, -P 16", vs("consume", "hset", 16), ">= 0.85x",
               lambda v: v >= 0.85, fmt_x, vs("consume", "hset", 16, tput_cpu)),
        target("TB.CONSUME denied vs HSET, -P 16", vs("denied", "hset", 16),
               ">= 1.0x", lambda v: v >= 1.0, fmt_x, vs("denied", "hset", 16, tput_cpu)),
        target("TB.CONSUME vs FCALL tb_consume, -P 16", vs("consume", "fcall", 16),
               ">= 4x", lambda v: v >= 4.0, fmt_x, vs("consume", "fcall", 16, tput_cpu)),
        target("bytes/bucket, module vs HSET+PEXPIREAT",
               None if "tb" not in per_bucket or "plain" not in per_bucket
               else (per_bucket["tb"], per_bucket["plain"]),
               "<= baseline", lambda v: v[0] <= v[1] + 0.5,
               lambda v: f"{v[0]:.1f} vs {v[1]:.1f}"),
        target(f"TB.CONSUME at {sizes[-1]:,} vs {sizes[0]:,} keys" if len(sizes) > 1
               else "TB.CONSUME at 5M vs 10k keys",
               scale_ratio, ">= 0.9x", lambda v: v >= 0.9, fmt_x, scale_vs("consume", scale_cpu)),
        target("instructions TB.CONSUME / HSET (in call())", i_ratio, "<= 1.5x",
               lambda v: v <= 1.5, fmt_x),
    ]
    tables["Targets"] = (["target", "goal", "this run", "result", "per server CPU-s"],
                         targets)
    return machine, rounds, tables


BREAKDOWN_NOTE = """Each `RM_` row is the function's inclusive cost under callgrind: Redis's
own code, which a module reaches only through these calls. Each does
work the contract requires (open the key, read and write the two fields,
replicate the effects, set the TTL, signal the change, reply with four
integers). "Redis's side alone / HSET" is therefore the ratio a module
with no code of its own would reach; the 1.5x target lies below it. The two `RM_Replicate` calls are the largest gap to HSET:
each looks its command name up again (`lookupCommandByCString`: an `sds`
copy, a split on `|`, a hash lookup) and builds an argv, while a plain
HSET propagates the argv it already has.

"""


def text_table(header, rows):
    cols = [header] + rows
    widths = [max(len(str(r[i])) for r in cols) for i in range(len(header))]
    line = lambda r: "  ".join(  # noqa: E731
        str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(zip(r, widths))
    )
    return "\n".join([line(header), line(["-" * w for w in widths])] + [line(r) for r in rows])


def md_table(header, rows):
    out = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def document(machine, rounds, tables, optimisations: str) -> str:
    big = int(machine.get("big", "5000000"))
    md = f"""# Benchmarks

Figures of the last `make bench` run (commit `{machine.get('commit', '?')}`,
{machine.get('started', '?')}). Regenerated by every run; the
"Optimisations" section comes from `bench/optimisations.md`.

## Reproduce

```sh
make bench          # deps, venv, release build, then bash bench/run.sh
```

`BENCH_ROUNDS`, `BENCH_SCALE` (request counts), `BENCH_BIG`, `BENCH_SKIP` and
`BENCH_SERVER` (another server binary)
are described at the top of `bench/run.sh`. Raw results land in
`target/bench/` (`results.tsv`, callgrind profiles).

## Machine

| | |
|---|---|
| CPU | {machine.get('cpu', '?')} |
| cores (`nproc`) | {machine.get('nproc', '?')} |
| kernel | {machine.get('kernel', '?')} |
| server | {machine.get('redis', '?')} (`{machine.get('server_bin', '?')}`) |
| load average at start / end | {machine.get('loadavg_start', '?')} / {machine.get('loadavg_end', '?')} |

The server is pinned to core 0 and `redis-benchmark` to core 1 (`taskset`).
On a shared machine other processes still run on both cores, so compare
figures of one run with each other (the ratios), not across runs.

## Method

* **Throughput**: one `redis-server` with the module and the Lua library
  (`FUNCTION LOAD REPLACE lua/tb.lua`), `redis-benchmark -c 50` with
  `-P 16` and with `-P 1`, keys `rl:__rand_int__` over `-r 1000000`,
  `FLUSHALL` before each run. The cases run interleaved, {rounds} rounds,
  each round every case at `-P 16` and then every case at `-P 1`; ops/s
  are medians, and each ratio is the median of the per-round ratios (the
  runs a ratio compares are close in time, so they see much the same
  load).
  The "per CPU-s" columns divide requests by the server process's CPU
  time during the run (`/proc/PID/stat`): on a shared machine other
  processes take turns on the server's core, which lowers ops/s but not
  ops per CPU second, so those ratios are the steadier estimate of an idle
  machine's. Buckets are `max 1000000 rate 0.001 cost 1`:
  always admitted, and (like the HSET keys) alive for the whole run (reset
  after 1000 s), so both grow the keyspace the same way. The denied case
  and TB.PEEK use one hot key drained first (`max 1 rate 0.0001`), so every
  call reads and decodes a stored bucket and writes nothing.
  redis-benchmark 7.0 draws a separate number for each `__rand_int__` of a
  command, so the three TB.MCONSUME keys (`rl:__rand_int__:a/b/c`) are
  independent random buckets.
* **Memory**: 1,000,000 buckets `rl:user:0000001`... created through
  `redis-cli --pipe` (`bench/gen.py`), `used_memory` after minus before,
  divided by the keys. The baseline writes the same hash (`tokens 99`,
  `ts` of 16 digits) with `HSET` + `PEXPIREAT` and no module. The target
  counts as met within 0.5 byte per bucket (allocator noise between runs).
* **Scale**: TB.CONSUME, `-P 16`, on a server holding 10,000 buckets and on
  one holding {big:,}, with `-r` equal to the keyspace so every call updates
  an existing bucket; the incremental rehash is let finish first. HSET of
  the same keys, interleaved, is the control: how much a larger keyspace
  costs Redis itself (cache and TLB misses on the dicts and values).
* **Instructions**: a fresh server under `valgrind --tool=callgrind`, N and
  2N commands (N = 20,000; keys over 1,000,000 as in the throughput cases,
  10,000 existing buckets, or the hot key); (cost(2N) - cost(N)) / N, so
  start-up and shutdown cancel out. "in call()" is Redis's `call()`
  inclusive (the command proper: module context, key API, replication,
  reply); "whole server" adds reading, parsing and writing. The commands
  come from `bench/gen.py` with keys drawn by a fixed seed, through
  `redis-cli --pipe`, so both runs replay the same stream; figures still
  move by about 2% between runs (the cron's incremental rehash runs on wall
  time). FCALL gets only the whole-server figure: `call()` recurses
  through `redis.call`.

"""
    titles = {
        "Throughput": "Throughput (ops/s, median)",
        "Memory": "Memory per bucket",
        "Scale": "Keyspace scale",
        "Instructions": "Instructions per command (callgrind)",
        "Breakdown": "Where TB.CONSUME's instructions in call() go",
        "Targets": "Targets",
    }
    md += "## Results\n\n"
    for key in ["Throughput", "Memory", "Scale", "Instructions", "Breakdown"]:
        header, rows = tables[key]
        md += f"### {titles[key]}\n\n{md_table(header, rows)}\n\n"
        if key == "Breakdown" and rows:
            md += BREAKDOWN_NOTE
    header, rows = tables["Targets"]
    md += ("## Targets\n\nReported, never asserted by tests. The result is judged on ops/s, "
           "as the targets are stated; the last column is the same ratio in ops per second "
           "of server CPU time (see Method).\n\n" + md_table(header, rows) + "\n\n")
    if optimisations:
        md += optimisations.strip() + "\n"
    return md


def main():
    outdir = Path(sys.argv[1])
    machine, rounds, tables = build(outdir)
    for key, (header, rows) in tables.items():
        print(f"\n== {key} ==")
        print(text_table(header, rows))
    if len(sys.argv) > 2:
        opt = Path(__file__).with_name("optimisations.md")
        doc = document(machine, rounds, tables, opt.read_text() if opt.exists() else "")
        Path(sys.argv[2]).write_text(doc)
        print(f"\nwrote {sys.argv[2]}")


if __name__ == "__main__":
    main()
