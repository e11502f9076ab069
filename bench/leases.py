#!/usr/bin/env python3
"""`make bench-leases`: what a lease call costs on a key of 1, 100, 1,000
and 10,000 live leases, on four semaphores:

- the module: TB.ACQUIRE key limit lease_ms id, TB.RELEASE key id,
  TB.RENEW key id lease_ms;
- the Lua library: FCALL tb_acquire 1 key ..., and tb_release, tb_renew;
- the EVAL script (target/lua/tb-eval.lua): EVALSHA <sha> 1 key acquire ...;
- the common recipe, a sorted set of ids scored by expiry, as one script
  (bench/semaphore-zset.lua: EVALSHA ...), released by ZREM, renewed by
  ZADD XX.

Three measurements:

- pairs: the key holds N leases that outlive the run (as stored: HSET of
  `<expires_at_us>:1` fields and, for the module's forms, the summary a
  first call writes; ZADD of expiry scores), then P pairs with fresh ids
  (limit N + 1, so every acquire takes the one free slot and every
  release gives it back) go through `redis-cli --pipe` on one connection.
  Measured: pairs per wall second, server CPU µs per pair, and under
  callgrind the whole server's instructions per pair ((cost of 2P - cost
  of P) / P, which cancels start-up and the filling).
- denials: the same key full (limit N), P acquires with fresh ids, each
  denied: µs and instructions per denial.
- churn: 10,000 live leases of 30 s, each renewed every 10 s, while
  acquires and releases of other ids go on, for CHURN_SECONDS of real
  time (so the key's horizon passes and full passes happen): server µs
  per lease call (INFO commandstats, passes included) and the longest
  single call (SLOWLOG).

Rounds are interleaved across cases; figures are medians.

    python3 bench/leases.py [--report docs/benchmarks.md] [--rounds 3] [--no-callgrind]
                            [--churn-seconds 45]

The server is Debian's redis-server (BENCH_SERVER to change it) with the
module (target/release) and the Functions library (lua/tb.lua) loaded,
pinned to core 0; the clients to core 1.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis

from doc_section import write_section

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
MODULE = ROOT / "target/release/libredis_tokenbucket.so"
LIBRARY = ROOT / "lua/tb.lua"
EVAL_SCRIPT = ROOT / "target/lua/tb-eval.lua"
ZSET_SCRIPT = HERE / "semaphore-zset.lua"
SERVER = os.environ.get("BENCH_SERVER", "/usr/bin/redis-server")
KEY = "bench:lease"
LIVE = (1, 100, 1_000, 10_000)
BACKENDS = ("module", "FCALL", "EVAL script", "zset script")
LEASE_MS = 600_000
DAY_MS = 86_400_000
TICK = os.sysconf("SC_CLK_TCK")
PIN_SERVER = ["taskset", "-c", "0"] if (os.cpu_count() or 1) >= 2 else []
PIN_CLIENT = ["taskset", "-c", "1"] if (os.cpu_count() or 1) >= 2 else []

# The churn: CHURN_LIVE leases of CHURN_LEASE_MS, each renewed every
# CHURN_RENEW_MS, and CHURN_OTHERS acquire/release pairs a second.
CHURN_LIVE = 10_000
CHURN_LEASE_MS = 30_000
CHURN_RENEW_MS = 10_000
CHURN_OTHERS = 200
TICK_S = 0.1

# Targets, each a ratio within one run:
TARGET_FLAT_MODULE = 1.3  # a module pair at 10,000 live <= 1.3x the pair at 1
TARGET_FLAT_FCALL = 1.5  # an FCALL pair at 10,000 <= 1.5x its pair at 1
TARGET_MODULE_VS_ZSET = 1.5  # module pairs/s >= 1.5x the recipe's, every size
TARGET_FCALL_VS_ZSET = 0.4  # FCALL pairs/s >= 0.4x the recipe's, every size
TARGET_FLAT_DENIAL = 1.5  # a denial at a full key of 10,000 <= 1.5x at one of 1
# The slope guard: whole-server instructions per module pair may grow by
# at most this much per live lease from 1 to 10,000 (before the summary,
# every call read every lease: about 2,700 per lease).
PER_LEASE_INSTR = 1.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Server:
    """One redis-server with the module and the library, on a free port."""

    def __init__(self, workdir: Path, wrap: list[str] | None = None) -> None:
        self.port = free_port()
        workdir.mkdir(parents=True, exist_ok=True)
        args = [*PIN_SERVER, *(wrap or []), SERVER, "--port", str(self.port), "--bind", "127.0.0.1",
                "--save", "", "--appendonly", "no", "--dir", str(workdir),
                "--logfile", str(workdir / "server.log"), "--loadmodule", str(MODULE)]  # fmt: skip
        if wrap:
            # Under callgrind a run is slow, and serverCron's ticks (about
            # 10 a second of it) land in the measured difference: at 1 a
            # second they cost a pair next to nothing.
            args += ["--hz", "1"]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.client = redis.Redis(port=self.port, socket_timeout=120)
        deadline = time.monotonic() + 120
        while True:
            try:
                self.client.ping()
                break
            except redis.ConnectionError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the server did not start, see {workdir}/server.log") from None
                time.sleep(0.1)
        self.client.function_load(LIBRARY.read_text(), replace=True)
        self.sha = {
            "zset script": self.client.script_load(ZSET_SCRIPT.read_text()),
            "EVAL script": self.client.script_load(EVAL_SCRIPT.read_text()),
        }

    def cpu_seconds(self) -> float:
        # The server is the last process of the taskset/valgrind chain: exec'd, same pid.
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICK

    def stop(self) -> None:
        with contextlib.suppress(redis.ConnectionError):
            self.client.shutdown(nosave=True)
        try:
            self.proc.wait(120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# ---- the commands, per semaphore ----------------------------------------------


def acquire(backend: str, sha: dict[str, str], key: str, limit: int, lease_ms: int, lease_id: str) -> list[str]:
    args = [str(limit), str(lease_ms), lease_id]
    if backend == "module":
        return ["TB.ACQUIRE", key, *args]
    if backend == "FCALL":
        return ["FCALL", "tb_acquire", "1", key, *args]
    if backend == "EVAL script":
        return ["EVALSHA", sha[backend], "1", key, "acquire", *args]
    return ["EVALSHA", sha[backend], "1", key, *args]


def release(backend: str, sha: dict[str, str], key: str, lease_id: str) -> list[str]:
    if backend == "module":
        return ["TB.RELEASE", key, lease_id]
    if backend == "FCALL":
        return ["FCALL", "tb_release", "1", key, lease_id]
    if backend == "EVAL script":
        return ["EVALSHA", sha[backend], "1", key, "release", lease_id]
    return ["ZREM", key, lease_id]


def renew(backend: str, sha: dict[str, str], key: str, lease_id: str, lease_ms: int, now_ms: int) -> list[str]:
    if backend == "module":
        return ["TB.RENEW", key, lease_id, str(lease_ms)]
    if backend == "FCALL":
        return ["FCALL", "tb_renew", "1", key, lease_id, str(lease_ms)]
    if backend == "EVAL script":
        return ["EVALSHA", sha[backend], "1", key, "renew", lease_id, str(lease_ms)]
    return ["ZADD", key, "XX", str(now_ms + lease_ms), lease_id]


def acquired(backend: str, reply: object) -> bool:
    if backend == "zset script":
        return reply == 1
    return isinstance(reply, list) and reply[0] == 1


def resp(*args: str) -> bytes:
    out = [f"*{len(args)}\r\n".encode()]
    for a in args:
        b = a.encode()
        out.append(b"$%d\r\n%s\r\n" % (len(b), b))
    return b"".join(out)


def payload(kind: str, backend: str, live: int, count: int, sha: dict[str, str]) -> bytes:
    """P pairs (a fresh id takes the one free slot and gives it back), or P
    denials (a fresh id at a full key)."""
    out = []
    for i in range(count):
        lease_id = f"p{i}"
        if kind != "denials":
            out.append(resp(*acquire(backend, sha, KEY, live + 1, LEASE_MS, lease_id)))
            out.append(resp(*release(backend, sha, KEY, lease_id)))
        else:
            out.append(resp(*acquire(backend, sha, KEY, live, LEASE_MS, lease_id)))
    return b"".join(out)


def now_us(c: redis.Redis) -> int:
    seconds, micros = c.time()
    return int(seconds) * 1_000_000 + int(micros)


def fill(server: Server, kind: str, backend: str, live: int) -> None:
    """The key with `live` leases that outlive the run, as stored (and as
    the first call on it leaves it: with its summary, for the module's
    forms, so no measured call pays the conversion). They were taken for
    the lease time the measured calls take too (as on a key capping one
    model's streams), except for "early pairs": for a day, so each new
    lease is among the earliest to expire, which the summary lists."""
    c = server.client
    c.flushall()
    now = now_us(c)
    lease_ms = DAY_MS if kind == "early pairs" else LEASE_MS
    ids = [f"live{j}" for j in range(live)]
    if backend == "zset script":
        c.zadd(KEY, {i: now // 1000 + lease_ms for i in ids})
    else:
        for start in range(0, live, 5_000):
            c.hset(KEY, mapping={i: f"{now + lease_ms * 1000 + j}:1" for j, i in enumerate(ids[start : start + 5_000])})
        c.pexpireat(KEY, now // 1000 + lease_ms + 1)
        c.execute_command(*release(backend, server.sha, KEY, "nobody"))


def check(server: Server, kind: str, backend: str, live: int) -> None:
    """One call through redis-py: a pair takes the free slot and gives it
    back, a denial is denied; the key still holds `live` leases."""
    c = server.client
    if kind != "denials":
        got = c.execute_command(*acquire(backend, server.sha, KEY, live + 1, LEASE_MS, "check"))
        assert acquired(backend, got), (backend, live, got)
        c.execute_command(*release(backend, server.sha, KEY, "check"))
    else:
        got = c.execute_command(*acquire(backend, server.sha, KEY, live, LEASE_MS, "check"))
        assert not acquired(backend, got), (backend, live, got)
    if backend == "zset script":
        size = c.zcard(KEY)
    else:
        # The summary and its list field (257 '#' bytes) hold no lease.
        size = c.hlen(KEY) - int(c.hexists(KEY, "")) - int(c.hexists(KEY, "#" * 257))
    assert size == live, (backend, live, size)


def pipe(server: Server, data: bytes) -> float:
    """Sends `data` through redis-cli --pipe; the wall seconds it took."""
    start = time.perf_counter()
    done = subprocess.run(
        [*PIN_CLIENT, "redis-cli", "-p", str(server.port), "--pipe", "--pipe-timeout", "0"],
        input=data,
        capture_output=True,
        check=True,
    )
    elapsed = time.perf_counter() - start
    text = done.stdout.decode()
    if "errors: 0," not in text:
        raise RuntimeError(f"redis-cli --pipe: {text}")
    return elapsed


@dataclass
class Case:
    kind: str  # "pairs", "denials" or "early pairs"
    backend: str
    live: int
    count: int = 0
    ops: list[float] = field(default_factory=list)  # per wall second
    cpu_us: list[float] = field(default_factory=list)  # server CPU µs per op
    instructions: float | None = None  # whole server, per op

    def median_ops(self) -> float:
        return statistics.median(self.ops)

    def median_cpu(self) -> float:
        return statistics.median(self.cpu_us)


def run_round(server: Server, case: Case) -> None:
    fill(server, case.kind, case.backend, case.live)
    check(server, case.kind, case.backend, case.live)
    data = payload(case.kind, case.backend, case.live, case.count, server.sha)
    cpu0 = server.cpu_seconds()
    seconds = pipe(server, data)
    cpu1 = server.cpu_seconds()
    check(server, case.kind, case.backend, case.live)  # every pair gave its slot back
    case.ops.append(case.count / seconds)
    case.cpu_us.append((cpu1 - cpu0) * 1e6 / case.count)


def calibrate(server: Server, case: Case, seconds: float) -> None:
    """Enough operations for about `seconds` of server time."""
    fill(server, case.kind, case.backend, case.live)
    probe = 300
    cpu0 = server.cpu_seconds()
    start = time.perf_counter()
    pipe(server, payload(case.kind, case.backend, case.live, probe, server.sha))
    per_op = max(server.cpu_seconds() - cpu0, time.perf_counter() - start) / probe
    case.count = int(min(200_000, max(1_000, seconds / max(per_op, 1e-7))))


def callgrind(workdir: Path, case: Case) -> float:
    """Whole-server instructions per operation under callgrind."""
    totals = []
    count = 1_000
    name = f"{case.kind}.{case.backend.split()[0]}.{case.live}"
    for mult in (1, 2):
        out = workdir / f"callgrind.{name}.{mult}.out"
        wrap = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}"]
        server = Server(workdir / f"cg-{name}-{mult}", wrap)
        try:
            fill(server, case.kind, case.backend, case.live)
            pipe(server, payload(case.kind, case.backend, case.live, count * mult, server.sha))
        finally:
            server.stop()
        text = out.read_text(errors="replace")
        found = re.search(r"^(?:summary|totals):\s*(\d+)", text, re.M)
        if found is None:
            raise RuntimeError(f"no totals in {out}")
        totals.append(int(found.group(1)))
    return (totals[1] - totals[0]) / count


# ---- the churn ------------------------------------------------------------------


@dataclass
class Churn:
    backend: str
    calls: int = 0
    us_per_call: float = 0.0
    longest_us: int = 0
    longest_command: str = ""


# How a semaphore's lease calls start, as SLOWLOG shows them.
PREFIXES = {
    "module": ("TB.",),
    "FCALL": ("FCALL",),
    "EVAL script": ("EVALSHA",),
    "zset script": ("EVALSHA", "ZREM", "ZADD"),
}


def churn(server: Server, backend: str, seconds: float) -> Churn:
    """CHURN_LIVE leases of CHURN_LEASE_MS renewed every CHURN_RENEW_MS (each
    at its own phase), CHURN_OTHERS acquires and releases a second. Every
    call's time is read from SLOWLOG (threshold 0), which times each
    top-level command alone, so reading it costs the figures nothing."""
    c = server.client
    c.flushall()
    sha = server.sha
    now = now_us(c)
    # As renewed over the last CHURN_RENEW_MS: lease j ends its phase into
    # the last third of the lease time.
    ids = [f"s{j}" for j in range(CHURN_LIVE)]
    ends_ms = [CHURN_LEASE_MS - CHURN_RENEW_MS + j * CHURN_RENEW_MS // CHURN_LIVE for j in range(CHURN_LIVE)]
    for start in range(0, CHURN_LIVE, 5_000):
        batch = range(start, min(start + 5_000, CHURN_LIVE))
        if backend == "zset script":
            c.zadd(KEY, {ids[j]: now // 1000 + ends_ms[j] for j in batch})
        else:
            c.hset(KEY, mapping={ids[j]: f"{now + ends_ms[j] * 1000}:1" for j in batch})
    c.pexpire(KEY, CHURN_LEASE_MS * 2)
    # As the first call leaves the key (with its summary): the churn
    # counts the passes of its horizons, not this one-off conversion.
    c.execute_command(*release(backend, sha, KEY, "nobody"))
    limit = CHURN_LIVE + CHURN_OTHERS
    c.config_set("slowlog-max-len", 8192)
    c.config_set("slowlog-log-slower-than", 0)
    c.slowlog_reset()
    result = Churn(backend)
    total_us = 0
    start = time.monotonic()
    renewed = 0  # renewals sent: lease `renewed % CHURN_LIVE` is next
    held: list[str] = []
    n = 0
    while (elapsed := time.monotonic() - start) < seconds:
        p = c.pipeline(transaction=False)
        now_ms = now_us(c) // 1000
        for _ in range(renewed, int(elapsed * 1000 * CHURN_LIVE / CHURN_RENEW_MS)):
            p.execute_command(*renew(backend, sha, KEY, ids[renewed % CHURN_LIVE], CHURN_LEASE_MS, now_ms))
            renewed += 1
        for _ in range(int(CHURN_OTHERS * TICK_S)):
            if held:
                p.execute_command(*release(backend, sha, KEY, held.pop(0)))
            lease_id = f"o{n}"
            n += 1
            p.execute_command(*acquire(backend, sha, KEY, limit, CHURN_LEASE_MS, lease_id))
            held.append(lease_id)
        p.execute()
        for entry in c.slowlog_get(8192):
            command = entry["command"]
            command = command.decode(errors="replace") if isinstance(command, bytes) else str(command)
            if not command.upper().startswith(PREFIXES[backend]):
                continue
            result.calls += 1
            total_us += entry["duration"]
            if entry["duration"] > result.longest_us:
                result.longest_us, result.longest_command = entry["duration"], command
        c.slowlog_reset()
        time.sleep(max(0.0, TICK_S - (time.monotonic() - start - elapsed)))
    c.config_set("slowlog-log-slower-than", 10_000)
    result.us_per_call = total_us / result.calls if result.calls else 0.0
    return result


# ---- the report -----------------------------------------------------------------


def ratio(a: float, b: float) -> str:
    return f"{a / b:,.2f}x" if b else "—"


def growth(c: Case, one: Case) -> str:
    """A case's cost against the same semaphore's with 1 live lease."""
    text = ratio(c.median_cpu(), one.median_cpu())
    if c.instructions and one.instructions:
        text += f" ({ratio(c.instructions, one.instructions)} instr.)"
    return text


def cost(c: Case) -> float:
    """What the flatness targets compare: instructions where callgrind ran
    (the stable figure), else server µs."""
    return c.instructions if c.instructions else c.median_cpu()


def report(cases: dict[tuple[str, str, int], Case], churns: list[Churn], rounds: int, churn_s: float) -> str:
    lines = [
        "",
        f"`make bench-leases` ({time.strftime('%Y-%m-%d')}, commit `{commit()}`): "
        f"{Path(SERVER).name} {server_version()} with the module, the Functions library and the EVAL script, "
        f"on loopback; {rounds} interleaved rounds, medians. A pair is one acquire that takes the one free slot "
        "of a key holding N live leases (limit N + 1) and the release that gives it back, with a fresh id each "
        f"time, all leases of {LEASE_MS // 60_000} min (as on a key capping one model's streams); a denial is "
        "an acquire of a fresh id at a full key (limit N). Each is pipelined through "
        "`redis-cli --pipe` on one connection (server on core 0, client on core 1). The recipe is "
        "`bench/semaphore-zset.lua` (a sorted set scored by expiry, pruned by ZREMRANGEBYSCORE, counted by "
        "ZCARD), released by ZREM, renewed by ZADD XX. Instructions: the whole server under callgrind, per "
        "operation, the figure the targets compare (pairs/s is one pipe's, which the client bounds for the "
        "faster forms). A shared 2-core machine: compare within the table.",
        "",
        "| live leases | semaphore | pairs/s | server µs per pair | instructions per pair "
        "| denials/s | server µs per denial | instructions per denial |",
        "|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for live in LIVE:
        for backend in BACKENDS:
            p, d = cases.get(("pairs", backend, live)), cases.get(("denials", backend, live))
            if p is None or not p.ops or d is None or not d.ops:
                continue
            pi = f"{p.instructions:,.0f}" if p.instructions is not None else "—"
            di = f"{d.instructions:,.0f}" if d.instructions is not None else "—"
            lines.append(f"| {live:,} | {backend} | {p.median_ops():,.0f} | {p.median_cpu():.1f} | {pi} "
                         f"| {d.median_ops():,.0f} | {d.median_cpu():.1f} | {di} |")  # fmt: skip
    lines += ["", "Growth with the live leases on the key (server µs, and instructions):", ""]
    header = " | ".join(f"pair {n:,} vs 1" for n in LIVE[1:])
    lines += [f"| semaphore | {header} | denial 10,000 vs 1 |", "|---|" + "---:|" * len(LIVE)]
    for backend in BACKENDS:
        one, many = cases.get(("pairs", backend, 1)), [cases.get(("pairs", backend, n)) for n in LIVE[1:]]
        d1, dn = cases.get(("denials", backend, 1)), cases.get(("denials", backend, LIVE[-1]))
        if not (one and one.ops and all(m and m.ops for m in many) and d1 and dn and d1.ops and dn.ops):
            continue
        cells = " | ".join(growth(m, one) for m in many if m)
        lines.append(f"| {backend} | {cells} | {growth(dn, d1)} |")
    early = [(b, cases.get(("early pairs", b, 1)), cases.get(("early pairs", b, LIVE[-1]))) for b in BACKENDS]
    early = [(b, one, many) for b, one, many in early if one and many and one.ops and many.ops]
    if early:
        lines += [
            "",
            "The worst case of a pair: the key's leases were taken for a day, so each new lease (of "
            f"{LEASE_MS // 60_000} min) is among the earliest to expire, which the summary lists: each acquire "
            "and release reads and rewrites that list.",
            "",
            f"| semaphore | pairs/s, 1 live | µs per pair | instructions | pairs/s, {LIVE[-1]:,} live "
            "| µs per pair | instructions | growth |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for b, one, many in early:
            oi = f"{one.instructions:,.0f}" if one.instructions else "—"
            mi = f"{many.instructions:,.0f}" if many.instructions else "—"
            lines.append(f"| {b} | {one.median_ops():,.0f} | {one.median_cpu():.1f} | {oi} | {many.median_ops():,.0f} "
                         f"| {many.median_cpu():.1f} | {mi} | {growth(many, one)} |")  # fmt: skip
    if churns:
        lines += [
            "",
            f"Churn: {CHURN_LIVE:,} live leases of {CHURN_LEASE_MS // 1000} s, each renewed every "
            f"{CHURN_RENEW_MS // 1000} s at its own phase, while {CHURN_OTHERS} other ids a second are acquired "
            f"and released, for {churn_s:.0f} s (the key's horizon passes, so its passes are counted). Each "
            "call's server time from SLOWLOG (threshold 0): the mean and the longest single call.",
            "",
            "| semaphore | lease calls | server µs per call | longest call µs | longest command |",
            "|---|---:|---:|---:|---|",
        ]
        for ch in churns:
            lines.append(f"| {ch.backend} | {ch.calls:,} | {ch.us_per_call:.2f} | {ch.longest_us:,} "
                         f"| `{ch.longest_command[:40]}` |")  # fmt: skip
    lines += ["", "| target | measured | |", "|---|---:|---|"]

    def at_most(name: str, value: float | None, most: float) -> None:
        if value is not None:
            lines.append(f"| {name} | {value:.2f}x | {'PASS' if value <= most else 'MISS'} |")

    def at_least(name: str, value: float | None, least: float) -> None:
        if value is not None:
            lines.append(f"| {name} | {value:.2f}x | {'PASS' if value >= least else 'MISS'} |")

    def flat(kind: str, backend: str) -> float | None:
        one, many = cases.get((kind, backend, 1)), cases.get((kind, backend, LIVE[-1]))
        if not (one and many and one.ops and many.ops):
            return None
        return cost(many) / cost(one)

    def ops_ratio(a: str, b: str, live: int) -> float | None:
        """a's pairs per unit of Redis's work against b's: instructions where
        callgrind ran, else server CPU µs (one pipe's wall-clock pairs/s
        is the client's speed, not Redis's, for the faster forms)."""
        x, y = cases.get(("pairs", a, live)), cases.get(("pairs", b, live))
        return cost(y) / cost(x) if x and y and x.ops and y.ops else None

    at_most(f"module pair, 10,000 live vs 1, <= {TARGET_FLAT_MODULE}x", flat("pairs", "module"), TARGET_FLAT_MODULE)
    at_most(f"FCALL pair, 10,000 live vs 1, <= {TARGET_FLAT_FCALL}x", flat("pairs", "FCALL"), TARGET_FLAT_FCALL)
    for backend in ("module", "FCALL"):
        at_most(f"{backend} denial at a full key, 10,000 vs 1, <= {TARGET_FLAT_DENIAL}x", flat("denials", backend),
                TARGET_FLAT_DENIAL)  # fmt: skip
    for live in LIVE:
        at_least(f"module >= {TARGET_MODULE_VS_ZSET}x the recipe's pairs per unit of Redis work, {live:,} live",
                 ops_ratio("module", "zset script", live), TARGET_MODULE_VS_ZSET)  # fmt: skip
    for live in LIVE:
        at_least(f"FCALL >= {TARGET_FCALL_VS_ZSET}x the recipe's pairs per unit of Redis work, {live:,} live",
                 ops_ratio("FCALL", "zset script", live), TARGET_FCALL_VS_ZSET)  # fmt: skip
    one, many = cases.get(("pairs", "module", 1)), cases.get(("pairs", "module", LIVE[-1]))
    if one and many and one.instructions and many.instructions:
        slope = (many.instructions - one.instructions) / (LIVE[-1] - 1)
        ok = "PASS" if slope <= PER_LEASE_INSTR else "MISS"
        name = f"slope guard: module instructions per pair per live lease, 1 to {LIVE[-1]:,}, <= {PER_LEASE_INSTR:g}"
        lines.append(f"| {name} | {slope:,.2f} | {ok} |")
    lines += [
        "",
        "Where an FCALL pair's instructions go: two FCALL entries (with Redis's Lua GC step), 10 or 11 "
        "`redis.call`s of about 5k each, and the clock's reading come to about 170k on a key of one lease, "
        "which keeps no summary; the recipe's pair is about 70k, which leaves a summary's work about 4k "
        "under 0.4x. Redis 7's Lua hashes every byte of each string it interns, so a large key keeps its "
        "list of the earliest leases in a field of its own, which a call reads and writes only when it "
        "needs the list: most calls read and write the short summary alone.",
        "",
    ]
    return "\n".join(lines)


def server_version() -> str:
    out = subprocess.run([SERVER, "--version"], capture_output=True, text=True, check=False).stdout
    found = re.search(r"v=(\S+)", out)
    return found.group(1) if found else "?"


def commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "?"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--report", type=Path, help="docs/benchmarks.md: replace or append its section")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=0.7, help="server time per case and round")
    parser.add_argument("--churn-seconds", type=float, default=45.0, help="0: no churn rows")
    parser.add_argument("--no-callgrind", action="store_true")
    args = parser.parse_args()
    for path, how in ((MODULE, "make build"), (EVAL_SCRIPT, "make build")):
        if not path.exists():
            sys.exit(f"{path} is missing: {how}")
    churns: list[Churn] = []
    with tempfile.TemporaryDirectory(prefix="bench-leases.") as tmp:
        work = Path(tmp)
        server = Server(work / "main")
        cases = {(k, b, n): Case(k, b, n) for n in LIVE for b in BACKENDS for k in ("pairs", "denials")}
        # The worst case of a pair: each new lease joins the summary's list.
        cases |= {("early pairs", b, n): Case("early pairs", b, n) for n in (1, LIVE[-1]) for b in BACKENDS}
        try:
            for case in cases.values():
                calibrate(server, case, args.seconds)
            for r in range(args.rounds):
                for case in cases.values():
                    run_round(server, case)
                    print(f"round {r + 1}: {case.kind:7} {case.backend:12} {case.live:6,} live: "
                          f"{case.ops[-1]:10,.0f}/s {case.cpu_us[-1]:8.1f} us", flush=True)  # fmt: skip
            if args.churn_seconds > 0:
                for backend in BACKENDS:
                    ch = churn(server, backend, args.churn_seconds)
                    churns.append(ch)
                    print(f"churn {backend:12}: {ch.calls:,} calls, {ch.us_per_call:.2f} us/call, "
                          f"longest {ch.longest_us:,} us ({ch.longest_command[:30]})", flush=True)  # fmt: skip
        finally:
            server.stop()
        if not args.no_callgrind and shutil.which("valgrind"):
            for case in cases.values():
                if case.backend in ("module", "FCALL", "zset script"):
                    case.instructions = callgrind(work, case)
                    print(f"callgrind {case.kind:7} {case.backend:12} {case.live:6,} live: "
                          f"{case.instructions:12,.0f} instr", flush=True)  # fmt: skip
    text = report(cases, churns, args.rounds, args.churn_seconds)
    print(text)
    if args.report:
        write_section(args.report, "bench-leases", text, "Concurrency leases")


if __name__ == "__main__":
    main()
