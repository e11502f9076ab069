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
    tput = defaultdict(dict)  # (case, P) -> {round: ops/s}
    scale = defaultdict(dict)  # size -> {round: ops/s}
    mem = {}  # kind -> (keys, before, after)
    instr = {}  # (case, n) -> (total, in_call)
    for line in (outdir / "results.tsv").read_text().splitlines():
        f = line.split("\t")
        try:
            if f[0] == "tput" and f[4]:
                tput[(f[1], int(f[2]))][int(f[3])] = float(f[4])
            elif f[0] == "scale" and f[4]:
                scale[int(f[1])][int(f[3])] = float(f[4])
            elif f[0] == "mem":
                mem[f[1]] = (int(f[2]), int(f[3]), int(f[4]))
            elif f[0] == "instr" and f[3] and f[4]:
                instr[(f[1], int(f[2]))] = (int(f[3]), int(f[4]))
        except (IndexError, ValueError):
            print(f"report: skipping malformed line {line!r}", file=sys.stderr)
    return machine, tput, scale, mem, instr


def med(xs):
    return statistics.median(xs) if xs else None


def ratio(a, b):
    return a / b if a is not None and b else None


def fmt_ops(v):
    return "n/a" if v is None else f"{v:,.0f}"


def fmt_x(v):
    return "n/a" if v is None else f"{v:.2f}x"


def per_command(instr, case):
    """(in call(), whole process) instructions per command, from N and 2N."""
    runs = sorted(n for (c, n) in instr if c == case)
    if len(runs) < 2:
        return None, None
    n1, n2 = runs[0], runs[-1]
    (t1, c1), (t2, c2) = instr[(case, n1)], instr[(case, n2)]
    d = n2 - n1
    return (c2 - c1) / d, (t2 - t1) / d


def build(outdir: Path):
    machine, tput, scale, mem, instr = load(outdir)
    m = {k: med(list(v.values())) for k, v in tput.items()}
    rounds = max((len(v) for v in tput.values()), default=0)

    def vs(case, other, p):
        """Median over rounds of case/other in the same round: a load that
        drifts during the run shifts both runs of a round alike."""
        a, b = tput.get((case, p), {}), tput.get((other, p), {})
        return med([a[r] / b[r] for r in a if r in b and b[r]])

    tables = {}
    rows = []
    for case, label in CASES:
        p16, p1 = m.get((case, 16)), m.get((case, 1))
        rows.append([label, fmt_ops(p16), fmt_ops(p1), fmt_x(vs(case, "hset", 16)),
                     fmt_x(vs(case, "hset", 1))])
    tables["Throughput"] = (
        ["case", "ops/s -P 16", "ops/s -P 1", "/ HSET -P 16", "/ HSET -P 1"],
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

    sizes = sorted(scale)
    scale_ratio = None
    if len(sizes) > 1:
        small, big = scale[sizes[0]], scale[sizes[-1]]
        scale_ratio = med([big[r] / small[r] for r in big if r in small and small[r]])
    rows = [[f"{size:,} keys", fmt_ops(med(list(scale[size].values())))] for size in sizes]
    if scale_ratio is not None:
        rows.append([f"{sizes[-1]:,} / {sizes[0]:,}", fmt_x(scale_ratio)])
    tables["Scale"] = (["TB.CONSUME -P 16 over", "ops/s"], rows)

    ic = {case: per_command(instr, case) for case in ("hset", "consume", "update", "denied")}
    rows = []
    for case, label in [
        ("hset", "HSET"),
        ("consume", "TB.CONSUME admitted, random keys"),
        ("update", "TB.CONSUME admitted, 10,000 existing buckets"),
        ("denied", "TB.CONSUME denied, hot key"),
    ]:
        incall, whole = ic[case]
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
    tables["Instructions"] = (
        ["command", "instructions in call()", "instructions, whole server"],
        rows,
    )

    def target(name, value, goal, ok, shown):
        status = "n/a" if value is None else ("PASS" if ok(value) else "MISS")
        return [name, goal, shown(value) if value is not None else "n/a", status]

    targets = [
        target("TB.CONSUME admitted vs HSET, -P 16", vs("consume", "hset", 16), ">= 0.85x",
               lambda v: v >= 0.85, fmt_x),
        target("TB.CONSUME denied vs HSET, -P 16", vs("denied", "hset", 16),
               ">= 1.0x", lambda v: v >= 1.0, fmt_x),
        target("TB.CONSUME vs FCALL tb_consume, -P 16", vs("consume", "fcall", 16),
               ">= 4x", lambda v: v >= 4.0, fmt_x),
        target("bytes/bucket, module vs HSET+PEXPIREAT",
               None if "tb" not in per_bucket or "plain" not in per_bucket
               else (per_bucket["tb"], per_bucket["plain"]),
               "<= baseline", lambda v: v[0] <= v[1] + 0.5,
               lambda v: f"{v[0]:.1f} vs {v[1]:.1f}"),
        target(f"TB.CONSUME at {sizes[-1]:,} vs {sizes[0]:,} keys" if len(sizes) > 1
               else "TB.CONSUME at 5M vs 10k keys",
               scale_ratio, ">= 0.9x", lambda v: v >= 0.9, fmt_x),
        target("instructions TB.CONSUME / HSET (in call())", i_ratio, "<= 1.5x",
               lambda v: v <= 1.5, fmt_x),
    ]
    tables["Targets"] = (["target", "goal", "this run", "result"], targets)
    return machine, rounds, tables


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

`BENCH_ROUNDS`, `BENCH_SCALE` (request counts), `BENCH_BIG` and `BENCH_SKIP`
are described at the top of `bench/run.sh`. Raw results land in
`target/bench/` (`results.tsv`, callgrind profiles).

## Machine

| | |
|---|---|
| CPU | {machine.get('cpu', '?')} |
| cores (`nproc`) | {machine.get('nproc', '?')} |
| kernel | {machine.get('kernel', '?')} |
| server | redis-server {machine.get('redis', '?')} (Debian) |
| load average at start / end | {machine.get('loadavg_start', '?')} / {machine.get('loadavg_end', '?')} |

The server is pinned to core 0 and `redis-benchmark` to core 1 (`taskset`).
On a shared machine other processes still run on both cores, so compare
figures of one run with each other (the ratios), not across runs.

## Method

* **Throughput**: one `redis-server` with the module and the Lua library
  (`FUNCTION LOAD REPLACE lua/tb.lua`), `redis-benchmark -c 50` with
  `-P 16` and with `-P 1`, keys `rl:__rand_int__` over `-r 1000000`,
  `FLUSHALL` before each run. The cases run interleaved, {rounds} rounds;
  ops/s are medians, and each ratio is the median of the per-round ratios
  (runs of one round are close in time, so they see the same load). Buckets are `max 1000000 rate 0.001 cost 1`:
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
  an existing bucket; the incremental rehash is let finish first.
* **Instructions**: a fresh server under `valgrind --tool=callgrind`, N and
  2N requests (`-c 50 -P 16`, random keys); (cost(2N) - cost(N)) / N, so
  start-up and shutdown cancel out. "in call()" is Redis's `call()`
  inclusive (the command proper: module context, key API, replication,
  reply); "whole server" adds reading, parsing and writing.

"""
    titles = {
        "Throughput": "Throughput (ops/s, median)",
        "Memory": "Memory per bucket",
        "Scale": "Keyspace scale",
        "Instructions": "Instructions per command (callgrind)",
        "Targets": "Targets",
    }
    md += "## Results\n\n"
    for key in ["Throughput", "Memory", "Scale", "Instructions"]:
        header, rows = tables[key]
        md += f"### {titles[key]}\n\n{md_table(header, rows)}\n\n"
    header, rows = tables["Targets"]
    md += "## Targets\n\nReported, never asserted by tests.\n\n" + md_table(header, rows) + "\n\n"
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
