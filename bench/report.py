#!/usr/bin/env python3
"""Turns bench/run.sh's raw results into a table, and docs/benchmarks.md.

    report.py OUTDIR [DOC]

OUTDIR holds machine.tsv and results.tsv. Without DOC, only prints. The
document's text is bench/benchmarks.md.in, whose $names this script fills;
its "Optimisations" section points to bench/optimisations.md, kept by hand
(before/after figures of each change).
"""

import statistics
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from string import Template

HERE = Path(__file__).parent

# The targets. Only figures the module controls: a
# ratio of an admitted call to HSET sits below the floor the module API
# imposes (see the breakdown).
OWN_SHARE_NEW_MAX = 0.08  # the module's own code / call(), new keys
OWN_SHARE_UPDATE_MAX = 0.10  # the same, existing buckets
CELL_INSTR_MAX = 0.97  # TB.CONSUME / CL.THROTTLE admitted, whole-server instructions
CELL_ADMITTED_MIN = 1.0  # TB.CONSUME / CL.THROTTLE admitted, ops/s -P 16
CELL_DENIED_MIN = 1.2  # the same, denied
BARE_MAX = 1.25  # tb_consume / the bare Lua recipe, whole-server instructions
DENIED_MIN = 1.0  # a denied TB.CONSUME / HSET, ops/s
FCALL_MIN = 4.0  # TB.CONSUME / FCALL tb_consume
QUOTA_MAX = 1.05  # TB.QUOTA / TB.CONSUME, whole-server instructions
# A reservation / an admitted TB.CONSUME on an existing bucket: Redis reads
# and parses two more arguments (WAIT and its time, about 800 instructions
# outside call()), and the module searches the wait as well as the reset.
RESERVE_MAX = 1.10
BYTES_SLACK = 0.5  # allocator noise between runs, bytes per bucket

CASES = [
    ("hset", "HSET key tokens 1.5 ts 1764513600123456 (ceiling)"),
    ("consume", "TB.CONSUME admitted, random keys"),
    ("cell", "CL.THROTTLE admitted, random keys (redis-cell)"),
    ("denied", "TB.CONSUME denied, one hot key"),
    ("celldenied", "CL.THROTTLE denied, one hot key (redis-cell)"),
    ("peek", "TB.PEEK, one hot key"),
    ("mconsume", "TB.MCONSUME, 3 random buckets"),
    ("fcall", "FCALL tb_consume (Lua), random keys"),
    ("bare", "FCALL bare_consume (bare Lua recipe), random keys"),
]

# The redis-cell cases, which run only with BENCH_CELL_SO.
CELL_CASES = {"cell", "cellupdate", "celldenied"}
CELL_NOT_RUN = "not run (no BENCH_CELL_SO)"

MEM_KINDS = [
    ("tb", "TB.CONSUME (module)"),
    ("plain", "HSET + PEXPIREAT (no module)"),
    ("fcall", "FCALL tb_consume (Lua)"),
]

INSTR_CASES = [
    ("hset", "HSET"),
    ("consume", "TB.CONSUME admitted, random keys"),
    ("update", "TB.CONSUME admitted, 10,000 existing buckets"),
    ("denied", "TB.CONSUME denied, hot key"),
    ("cell", "CL.THROTTLE admitted, random keys (redis-cell)"),
    ("cellupdate", "CL.THROTTLE admitted, 10,000 existing buckets (redis-cell)"),
    ("celldenied", "CL.THROTTLE denied, hot key (redis-cell)"),
    ("fcall", "FCALL tb_consume, random keys"),
    ("fcallupdate", "FCALL tb_consume, 10,000 existing buckets"),
    ("eval", "EVALSHA of tb-eval.lua, consume, random keys"),
    ("bare", "FCALL bare_consume (bare recipe), random keys"),
    ("bareupdate", "FCALL bare_consume (bare recipe), 10,000 existing buckets"),
    ("bareeval", "EVALSHA of the bare recipe, random keys"),
    ("quota", "TB.QUOTA (MONTH) admitted, random keys"),
    ("quotaupdate", "TB.QUOTA (MONTH) admitted, 10,000 existing quotas"),
    ("reserve", "TB.CONSUME WAIT, a reservation on a hot key"),
]

# Side by side: (label, ours, theirs).
CELL_PAIRS = [
    ("admitted, new keys", "consume", "cell"),
    ("admitted, 10,000 existing buckets", "update", "cellupdate"),
    ("denied, hot key", "denied", "celldenied"),
]
BARE_PAIRS = [
    ("FCALL, new keys", "fcall", "bare"),
    ("FCALL, 10,000 existing buckets", "fcallupdate", "bareupdate"),
    ("EVALSHA, new keys", "eval", "bareeval"),
]

# The breakdown's columns: new keys, and existing buckets (as in the scale case).
BREAKDOWN_CASES = ("consume", "update")

# Where TB.CONSUME's instructions in call() go, per command: each module API
# function it calls (Redis's code, inclusive), as run.sh names them.
API_PARTS = [
    ("RM_HashSet: the two fields (HSET's own work)", ["HashSet"]),
    ("RM_HashGet: reading the stored bucket", ["HashGet"]),
    ("RM_Replicate x2: HSET + PEXPIREAT as effects", ["Replicate"]),
    ("RM_SetAbsExpire: the TTL", ["SetAbsExpire"]),
    ("RM_OpenKey + RM_CloseKey", ["OpenKey", "CloseKey"]),
    (
        "RM_CreateString + RM_FreeString: values for HashSet/Replicate",
        ["CreateString", "FreeString"],
    ),
    (
        "RM_ReplyWithArray + RM_ReplyWithLongLong x4",
        ["ReplyWithArray", "ReplyWithLongLong"],
    ),
    (
        "RM_SignalModifiedKey + RM_NotifyKeyspaceEvent x2",
        ["SignalModifiedKey", "NotifyKeyspaceEvent"],
    ),
    (
        "RM_StringPtrLen, RM_KeyType, RM_ValueLength: the arguments' bytes, the key's type",
        ["StringPtrLen", "KeyType", "ValueLength"],
    ),
]


@dataclass
class Run:
    """One run's raw results, as results.tsv holds them."""

    machine: dict = field(default_factory=dict)
    # (case, P) -> {round: ops/s}, and the same in ops per second of server
    # CPU time (when the run recorded the server's CPU).
    tput: dict = field(default_factory=lambda: defaultdict(dict))
    tput_cpu: dict = field(default_factory=lambda: defaultdict(dict))
    # (case, size) -> {round: ops/s}, and per CPU second.
    scale: dict = field(default_factory=lambda: defaultdict(dict))
    scale_cpu: dict = field(default_factory=lambda: defaultdict(dict))
    # Scale sizes left out for want of memory: size -> MiB available.
    scale_skipped: dict = field(default_factory=dict)
    mem: dict = field(default_factory=dict)  # kind -> (keys, before, after)
    # command -> (groups per call, calls, usec from INFO commandstats,
    # server CPU seconds or None)
    mcbig: dict = field(default_factory=dict)
    # case -> {server: (commands, whole server, in call())}
    instr: dict = field(default_factory=lambda: defaultdict(dict))
    # case -> {server: {API function or "handler": inclusive instructions}}
    fns: dict = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(lambda: defaultdict(int)))
    )


def load(outdir: Path) -> Run:
    run = Run()
    for line in (outdir / "machine.tsv").read_text().splitlines():
        k, _, v = line.partition("\t")
        run.machine[k] = v
    for line in (outdir / "results.tsv").read_text().splitlines():
        try:
            load_line(run, line.split("\t"))
        except (IndexError, ValueError):
            print(f"report: skipping malformed line {line!r}", file=sys.stderr)
    return run


def load_line(run: Run, f: list) -> None:
    if f[0] in ("tput", "scale") and f[4]:
        if f[0] == "tput":
            key, into, into_cpu = (f[1], int(f[2])), run.tput, run.tput_cpu
        else:
            key, into, into_cpu = (f[2], int(f[1])), run.scale, run.scale_cpu
        into[key][int(f[3])] = float(f[4])
        if len(f) > 6 and f[5] and float(f[5]) > 0:
            into_cpu[key][int(f[3])] = int(f[6]) / float(f[5])
    elif f[0] == "scale_skipped":
        run.scale_skipped[int(f[1])] = f[2]
    elif f[0] == "mem":
        run.mem[f[1]] = (int(f[2]), int(f[3]), int(f[4]))
    elif f[0] == "mcbig" and f[4]:
        cpu = float(f[5]) if len(f) > 5 and f[5] else None
        run.mcbig[f[1]] = (int(f[2]), int(f[3]), int(f[4]), cpu)
    elif f[0] == "instr" and f[4] and f[5]:
        run.instr[f[1]][f[2]] = (int(f[3]), int(f[4]), int(f[5]))
    elif f[0] == "fn":
        run.fns[f[1]][f[2]][f[4]] += int(f[5])


# ---- figures ----------------------------------------------------------------


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def ratio(a, b):
    return a / b if a is not None and b else None


def paired(a, b):
    """Median over rounds of a/b in the same round: a load that drifts
    during the run shifts both runs of a round alike."""
    return med([a[r] / b[r] for r in a if b.get(r)])


def cell_run(run):
    """Whether this run had redis-cell (BENCH_CELL_SO)."""
    return bool(run.machine.get("cell"))


def vs(run, case, other, p, cpu=False):
    """Throughput of `case` / `other` at -P p (per server CPU second if cpu)."""
    src = run.tput_cpu if cpu else run.tput
    return paired(src.get((case, p), {}), src.get((other, p), {}))


def scale_sizes(run):
    return sorted({size for (_, size) in run.scale})


def scale_vs(run, case, size, cpu=False):
    """Throughput of `case` on `size` keys / on the smallest keyspace."""
    sizes, src = scale_sizes(run), run.scale_cpu if cpu else run.scale
    return paired(src.get((case, size), {}), src.get((case, sizes[0]), {}))


def per_server(run, case, i):
    """Figure i (1: whole server, 2: in call()) per command, each server."""
    return [e[i] / e[0] for e in run.instr.get(case, {}).values()]


def whole_server(run, case):
    """Instructions per command, whole server less serverCron: the median
    of the servers."""
    return med(per_server(run, case, 1))


def in_call(run, case):
    """Instructions per command inside call(): the median of the servers."""
    return med(per_server(run, case, 2))


def instr_ratio(run, ours, theirs):
    return ratio(whole_server(run, ours), whole_server(run, theirs))


def fcall_vs_consume(run):
    """How many times TB.CONSUME's whole-server instructions FCALL costs."""
    return instr_ratio(run, "fcall", "consume")


def server_breakdown(run, case, server):
    """One server's split of call(), per command: the API parts (as
    API_PARTS), call()'s bookkeeping, Redis's side, the module's own code
    and the call() total."""
    n, _, total = run.instr[case][server]
    fns = run.fns[case][server]
    handler = fns.get("handler", 0) / n
    api = [sum(fns.get(name, 0) for name in names) / n for _, names in API_PARTS]
    own = handler - sum(api)
    total /= n
    return api + [total - handler, total - own, own, total]


def breakdown(run, case):
    """The breakdown of the median server (by instructions in call()), so
    the rows add up; None if the run lacks the figures."""
    servers = [s for s in run.instr.get(case, {}) if s in run.fns.get(case, {})]
    if not servers:
        return None
    servers.sort(key=lambda s: run.instr[case][s][2] / run.instr[case][s][0])
    return server_breakdown(run, case, servers[(len(servers) - 1) // 2])


def own_share(run, case):
    """(the module's own code, instructions in call()) per command."""
    parts = breakdown(run, case)
    return None if parts is None else (parts[-2], parts[-1])


def bytes_per_bucket(run, kind):
    if kind not in run.mem:
        return None
    keys, before, after = run.mem[kind]
    return (after - before) / keys if keys else None


# ---- formatting -------------------------------------------------------------


def fmt_x(v):
    return "n/a" if v is None else f"{v:.2f}x"


def fmt_n(v):
    return "n/a" if v is None else f"{v:,.0f}"


def text_table(header, rows):
    cols = [header] + rows
    widths = [max(len(str(r[i])) for r in cols) for i in range(len(header))]

    def line(r):
        return "  ".join(
            str(c).ljust(w) if i == 0 else str(c).rjust(w)
            for i, (c, w) in enumerate(zip(r, widths))
        )

    return "\n".join(
        [line(header), line(["-" * w for w in widths])] + [line(r) for r in rows]
    )


def md_table(header, rows):
    out = [
        "| " + " | ".join(header) + " |",
        "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|",
    ]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


# ---- tables: each returns (header, rows) ------------------------------------


def throughput_table(run):
    rows = []
    for case, label in CASES:
        if case in CELL_CASES and not cell_run(run):
            rows.append([label, CELL_NOT_RUN] + [""] * 5)
            continue
        ops = [fmt_n(med(list(run.tput.get((case, p), {}).values()))) for p in (16, 1)]
        rel = [
            fmt_x(vs(run, case, "hset", p, cpu))
            for cpu in (False, True)
            for p in (16, 1)
        ]
        rows.append([label] + ops + rel)
    header = ["case", "ops/s -P 16", "ops/s -P 1", "/ HSET -P 16", "/ HSET -P 1"]
    return header + ["per CPU-s / HSET -P 16", "per CPU-s / HSET -P 1"], rows


def memory_table(run):
    rows = []
    for kind, label in MEM_KINDS:
        if kind in run.mem:
            keys, before, after = run.mem[kind]
            per = bytes_per_bucket(run, kind)
            rows.append([label, f"{keys:,}", f"{after - before:,}", f"{per:.1f}"])
    return ["written by", "keys", "used_memory delta", "bytes/bucket"], rows


def scale_table(run):
    sizes = scale_sizes(run)
    rows = []
    for case, label in [("consume", "TB.CONSUME"), ("hset", "HSET (control)")]:
        if any(c == case for (c, _) in run.scale):
            ops = [
                fmt_n(med(list(run.scale.get((case, s), {}).values()))) for s in sizes
            ]
            rel = [
                fmt_x(scale_vs(run, case, s, cpu))
                for s in sizes[1:]
                for cpu in (False, True)
            ]
            rows.append([label] + ops + rel)
    header = ["-P 16, existing keys"] + [f"{s:,} keys" for s in sizes]
    for s in sizes[1:]:
        header += [f"{s:,} / {sizes[0]:,}", "per CPU-s"]
    return header, rows


def mcbig_table(run):
    """Server time per call of the largest TB.MCONSUME and of TB.CONSUME,
    and per bucket: from INFO commandstats (wall time), and in server CPU
    time (the steadier on a shared machine)."""
    rows = []
    per_bucket = {}
    for cmd, label in [
        ("tb.mconsume", "TB.MCONSUME, 10,000 groups, new keys"),
        ("tb.consume", "TB.CONSUME, new keys"),
    ]:
        if cmd in run.mcbig and run.mcbig[cmd][1]:
            groups, calls, usec, cpu = run.mcbig[cmd]
            cpu_us = None if cpu is None else cpu * 1e6 / calls
            per_bucket[cmd] = (usec / calls / groups, cpu_us and cpu_us / groups)
            rows.append(
                [
                    label,
                    f"{calls:,}",
                    f"{usec / calls:,.2f}",
                    f"{usec / calls / groups:.2f}",
                    "n/a" if cpu_us is None else f"{cpu_us:,.2f}",
                    "n/a" if cpu_us is None else f"{cpu_us / groups:.2f}",
                ]
            )
    if len(per_bucket) == 2:
        m, c = per_bucket["tb.mconsume"], per_bucket["tb.consume"]
        rows.append(
            ["per bucket, TB.MCONSUME / TB.CONSUME", "", "", fmt_x(ratio(m[0], c[0]))]
            + ["", fmt_x(ratio(m[1], c[1]))]
        )
    header = ["command", "calls", "µs per call", "µs per bucket"]
    return header + ["CPU µs per call", "CPU µs per bucket"], rows


def instructions_table(run):
    rows = []
    for case, label in INSTR_CASES:
        if case in CELL_CASES and not cell_run(run):
            rows.append([label, CELL_NOT_RUN, ""])
            continue
        whole = whole_server(run, case)
        # Lua: call() recurses through redis.call, so only the whole server.
        lua = case.startswith(("fcall", "bare", "eval"))
        incall = None if lua else in_call(run, case)
        if whole is not None:
            rows.append([label, fmt_n(incall), fmt_n(whole)])
    if fcall_vs_consume(run) is not None:
        rows.append(
            ["FCALL / TB.CONSUME random keys", "n/a", fmt_x(fcall_vs_consume(run))]
        )
    return ["command", "instructions in call()", "instructions, whole server"], rows


def pairs_table(run, pairs, ours_name, theirs_name, skip=None):
    rows = []
    for label, ours, theirs in pairs:
        if skip:
            rows.append([label, fmt_n(whole_server(run, ours)), skip, ""])
            continue
        rows.append(
            [
                label,
                fmt_n(whole_server(run, ours)),
                fmt_n(whole_server(run, theirs)),
                fmt_x(instr_ratio(run, ours, theirs)),
            ]
        )
    return ["whole-server instructions", ours_name, theirs_name, "ratio"], rows


def cell_table(run):
    skip = None if cell_run(run) else CELL_NOT_RUN
    return pairs_table(run, CELL_PAIRS, "TB.CONSUME", "CL.THROTTLE", skip)


def bare_table(run):
    return pairs_table(run, BARE_PAIRS, "tb_consume", "bare recipe")


def breakdown_table(run):
    columns = {case: breakdown(run, case) for case in BREAKDOWN_CASES}
    labels = [label for label, _ in API_PARTS] + [
        "module context and call() bookkeeping",
        "**Redis's side, total**",
        "the module's own code (parsing, arithmetic, encoding)",
        "**in call()**",
    ]
    rows = []
    if any(columns.values()):
        for i, label in enumerate(labels):
            rows.append(
                [label] + [fmt_n(columns[c] and columns[c][i]) for c in BREAKDOWN_CASES]
            )
        redis_side = [columns[c] and columns[c][-3] for c in BREAKDOWN_CASES]
        hset = in_call(run, "hset")
        rows.append(
            ["Redis's side alone / HSET in call()"]
            + [fmt_x(ratio(r, hset)) for r in redis_side]
        )
    return ["TB.CONSUME, per command", "new keys", "existing buckets"], rows


def target_row(name, goal, value, shown, cpu=None, missing="n/a"):
    """A targets row. goal is (its text, a test of the value): the result
    comes from the test, `missing` when the run lacks the figure."""
    text, ok = goal
    if value is None:
        return [name, text, missing, "n/a", ""]
    status = "PASS" if ok(value) else "MISS"
    return [name, text, shown(value), status, "" if cpu is None else fmt_x(cpu)]


def at_least(ratio_min):
    return f">= {ratio_min:.2g}x", lambda v: v >= ratio_min


def at_most(ratio_max):
    return f"<= {ratio_max:.2f}x", lambda v: v <= ratio_max


def own_share_row(run, case, label, share_max):
    def shown(v):
        return f"{v[0] / v[1]:.1%} ({v[0]:,.0f} of {v[1]:,.0f})"

    goal = f"<= {share_max:.0%}", lambda v: v[0] <= share_max * v[1]
    name = f"the module's own code / call(), {label}"
    return target_row(name, goal, own_share(run, case), shown)


def ops_row(run, name, case, other, ratio_min, missing="n/a"):
    """A target on throughput at -P 16: case / other >= ratio_min."""
    cpu = vs(run, case, other, 16, cpu=True)
    value = vs(run, case, other, 16)
    return target_row(name, at_least(ratio_min), value, fmt_x, cpu, missing)


def instr_row(run, name, ours, theirs, goal, missing="n/a"):
    """A target on whole-server instructions: ours / theirs."""
    return target_row(name, goal, instr_ratio(run, ours, theirs), fmt_x, None, missing)


def bytes_row(run):
    tb, plain = bytes_per_bucket(run, "tb"), bytes_per_bucket(run, "plain")
    goal = "<= HSET+PEXPIREAT", lambda v: v[0] <= v[1] + BYTES_SLACK
    value = None if tb is None or plain is None else (tb, plain)
    name = "bytes per bucket, module vs HSET+PEXPIREAT"
    return target_row(name, goal, value, lambda v: f"{v[0]:.1f} vs {v[1]:.1f}")


def targets_table(run):
    cell = "TB.CONSUME / CL.THROTTLE"
    no_cell = "n/a" if cell_run(run) else CELL_NOT_RUN
    bare = "tb_consume / the bare recipe, whole-server instructions"
    fcall = "TB.CONSUME / FCALL tb_consume"
    quota = "TB.QUOTA / TB.CONSUME, whole-server instructions"
    rows = [
        instr_row(
            run,
            f"{cell} admitted, whole-server instructions, new keys",
            "consume",
            "cell",
            at_most(CELL_INSTR_MAX),
            no_cell,
        ),
        instr_row(
            run,
            f"{cell} admitted, whole-server instructions, existing buckets",
            "update",
            "cellupdate",
            at_most(CELL_INSTR_MAX),
            no_cell,
        ),
        own_share_row(run, "consume", "new keys", OWN_SHARE_NEW_MAX),
        own_share_row(run, "update", "existing buckets", OWN_SHARE_UPDATE_MAX),
        instr_row(run, f"{quota}, new keys", "quota", "consume", at_most(QUOTA_MAX)),
        instr_row(run, f"{quota}, existing keys", "quotaupdate", "update", at_most(QUOTA_MAX)),
        instr_row(
            run,
            "TB.CONSUME WAIT reservation / TB.CONSUME admitted, whole-server instructions",
            "reserve",
            "update",
            at_most(RESERVE_MAX),
        ),
        instr_row(run, f"{bare}, FCALL", "fcall", "bare", at_most(BARE_MAX)),
        instr_row(run, f"{bare}, EVALSHA", "eval", "bareeval", at_most(BARE_MAX)),
        ops_row(
            run,
            f"{cell} admitted, ops/s -P 16",
            "consume",
            "cell",
            CELL_ADMITTED_MIN,
            no_cell,
        ),
        ops_row(
            run,
            f"{cell} denied, ops/s -P 16",
            "denied",
            "celldenied",
            CELL_DENIED_MIN,
            no_cell,
        ),
        ops_row(
            run, "TB.CONSUME denied / HSET, ops/s -P 16", "denied", "hset", DENIED_MIN
        ),
        target_row(
            f"{fcall}, whole-server instructions",
            at_least(FCALL_MIN),
            ratio(whole_server(run, "fcall"), whole_server(run, "consume")),
            fmt_x,
        ),
        ops_row(run, f"{fcall}, ops/s -P 16", "consume", "fcall", FCALL_MIN),
        bytes_row(run),
    ]
    return ["target", "goal", "this run", "result", "per server CPU-s"], rows


TABLES = {
    "Throughput": throughput_table,
    "Memory": memory_table,
    "Scale": scale_table,
    "Mcbig": mcbig_table,
    "Instructions": instructions_table,
    "Cell": cell_table,
    "Bare": bare_table,
    "Breakdown": breakdown_table,
    "Targets": targets_table,
}


# ---- the document -----------------------------------------------------------


def scale_note(run):
    """A sentence on the scale sizes left out, if any."""
    if not run.scale_skipped:
        return ""
    left = ", ".join(
        f"{size:,} keys ({mib} MiB available)"
        for size, mib in sorted(run.scale_skipped.items())
    )
    return f"Left out of this run for want of memory: {left}."


def document(run, tables) -> str:
    machine = run.machine
    rounds = max((len(v) for v in run.tput.values()), default=0)
    keys = "commit started cpu nproc kernel redis server_bin loadavg_start loadavg_end"
    fields = {k: machine.get(k, "?") for k in keys.split()}
    fields["rounds"] = rounds
    sizes = [int(s) for s in machine.get("big", "5000000").split()]
    fields["big"] = " and ".join(f"{s:,}" for s in sizes)
    fields["instr_servers"] = max((len(v) for v in run.instr.values()), default=0)
    fields["cell_status"] = (
        "redis-cell's rows ran (`BENCH_CELL_SO` was set)."
        if cell_run(run)
        else "redis-cell's rows did not run: `BENCH_CELL_SO` was not set."
    )
    fields["scale_note"] = scale_note(run)
    calls = run.mcbig.get("tb.mconsume", (0, 0, 0))[1]
    fields["mcbig_calls"] = f"{calls:,}" if calls else "20"
    for name, (header, rows) in tables.items():
        fields[name.lower()] = md_table(header, rows)
    fields["own_share_new_max"] = f"{OWN_SHARE_NEW_MAX:.0%}"
    fields["own_share_update_max"] = f"{OWN_SHARE_UPDATE_MAX:.0%}"
    fields["cell_instr_max"] = f"{CELL_INSTR_MAX:.2f}x"
    fields["cell_admitted_min"] = f"{CELL_ADMITTED_MIN:.1f}x"
    fields["cell_denied_min"] = f"{CELL_DENIED_MIN:.1f}x"
    fields["bare_max"] = f"{BARE_MAX:.2f}x"
    fields["denied_min"] = f"{DENIED_MIN:.1f}x"
    fields["fcall_min"] = f"{FCALL_MIN:.1f}x"
    fields["bytes_slack"] = f"{BYTES_SLACK:g}"
    template = Template((HERE / "benchmarks.md.in").read_text())
    return template.substitute(fields).rstrip("\n") + "\n"


def kept_sections(path: Path) -> str:
    """What other benches wrote into the same document (`make
    bench-gateway`, `make bench-python`, `make bench-node`): every section
    after this report's last one ("Optimisations"), kept as it is."""
    if not path.exists():
        return ""
    text = path.read_text()
    at = text.find("\n## Optimisations")
    after = text.find("\n## ", at + 1) if at >= 0 else -1
    return "" if after < 0 else text[after + 1 :]


def main():
    run = load(Path(sys.argv[1]))
    tables = {name: table(run) for name, table in TABLES.items()}
    for name, (header, rows) in tables.items():
        print(f"\n== {name} ==")
        print(text_table(header, rows))
    if len(sys.argv) > 2:
        doc = document(run, tables)
        kept = kept_sections(Path(sys.argv[2]))
        Path(sys.argv[2]).write_text(doc + ("\n" + kept if kept else ""))
        print(f"\nwrote {sys.argv[2]}")


if __name__ == "__main__":
    main()
