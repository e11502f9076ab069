"""What the client costs, measured, not asserted (`make bench-python`).

1. Overhead per call: `Limiter.consume` against a raw `execute_command` of
   the same command, one call at a time on one connection (so each figure
   is a round trip plus client work), sync and asyncio, on the module and
   on the Functions library. Rounds alternate raw and limiter calls, and the
   median round is reported, so a noisy neighbour skews both alike. Then
   the client's own work alone: the same calls with the connection
   replaced by a canned reply, which is steadier than any round trip.
2. The denial cache on a hot denied key: the same client retrying a denied
   request in a tight loop, with the cache off and on; round trips are
   counted by the server (INFO commandstats).

Writes a Markdown report to stdout, and with --readme FILE between the
`<!-- bench:begin -->` and `<!-- bench:end -->` lines of FILE.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path
from typing import Any

import redis
import redis.asyncio

sys.path.append(str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.append(str(Path(__file__).resolve().parents[3] / "bench"))
from doc_section import write_section
from tbservers import Server

import redis_tokenbucket.asyncio as tb_asyncio
from redis_tokenbucket import Bucket, DenialCache, Limiter

# Never empties during the run: every call is an admitted, written charge.
BIG = Bucket(1e12, 1e12)
CALLS = 2000
ROUNDS = 15
# Denied for the whole loop: one token, back after 100 s.
HOT = Bucket(1, 0.01)
HOT_CALLS = 20_000


def raw_args(backend: str, key: str) -> tuple[Any, ...]:
    if backend == "module":
        return ("TB.CONSUME", key, "1000000000000.0", "1000000000000.0", "1.0")
    return ("FCALL", "tb_consume", 1, key, "1000000000000.0", "1000000000000.0", "1.0")


def per_call_us(run: Callable[[int], float]) -> float:
    return run(CALLS) / CALLS * 1e6


def stub_limiter() -> Limiter:
    """A Limiter whose connection is a stub that always admits."""
    lim = Limiter(redis.Redis(), backend="module")
    reply = [1, 5, 0, 0]
    lim._transport.send = lambda command, timeout: reply  # what sends a plan's commands
    return lim


def sync_overhead(port: int, backend: str) -> tuple[float, float, float]:
    """(raw, raw followed by the client's work on a stub, limiter), in µs
    per call: the middle one tells whether the overhead is that work or
    something more on the wire."""
    r = redis.Redis(port=port)
    lim = Limiter(r, backend=backend)  # type: ignore[arg-type]
    lim.consume("bench:lim", BIG)  # loads the library if needed
    stub = stub_limiter()
    args = raw_args(backend, "bench:raw")

    def raw(n: int) -> float:
        start = time.perf_counter()
        for _ in range(n):
            r.execute_command(*args)
        return time.perf_counter() - start

    def raw_and_work(n: int) -> float:
        start = time.perf_counter()
        for _ in range(n):
            r.execute_command(*args)
            stub.consume("bench:k", BIG)
        return time.perf_counter() - start

    def limited(n: int) -> float:
        start = time.perf_counter()
        for _ in range(n):
            lim.consume("bench:lim", BIG)
        return time.perf_counter() - start

    runs: tuple[list[float], list[float], list[float]] = ([], [], [])
    for _ in range(ROUNDS):
        for out, measure in zip(runs, (raw, raw_and_work, limited), strict=True):
            out.append(per_call_us(measure))
    r.close()
    a, b, c = (statistics.median(x) for x in runs)
    return a, b, c


def async_overhead(port: int, backend: str) -> tuple[float, None, float]:
    async def main() -> tuple[float, float]:
        r = redis.asyncio.Redis(port=port)
        lim = tb_asyncio.Limiter(r, backend=backend)  # type: ignore[arg-type]
        await lim.consume("bench:alim", BIG)
        args = raw_args(backend, "bench:araw")

        async def raw(n: int) -> float:
            start = time.perf_counter()
            for _ in range(n):
                await r.execute_command(*args)
            return time.perf_counter() - start

        async def limited(n: int) -> float:
            start = time.perf_counter()
            for _ in range(n):
                await lim.consume("bench:alim", BIG)
            return time.perf_counter() - start

        raws, lims = [], []
        for _ in range(ROUNDS):
            raws.append(await raw(CALLS) / CALLS * 1e6)
            lims.append(await limited(CALLS) / CALLS * 1e6)
        await r.aclose()
        return statistics.median(raws), None, statistics.median(lims)

    return asyncio.run(main())


def client_work() -> tuple[float, float]:
    """µs per `consume` with no I/O at all: the reply comes from a stub."""
    reply = [1, 5, 0, 0]
    n = 50_000
    lim = stub_limiter()
    start = time.perf_counter()
    for _ in range(n):
        lim.consume("bench:k", BIG)
    sync = (time.perf_counter() - start) / n * 1e6

    async def main() -> float:
        async def send(command: Any, timeout: Any) -> list[int]:
            return reply

        alim = tb_asyncio.Limiter(redis.asyncio.Redis(), backend="module")
        alim._transport.send = send
        start = time.perf_counter()
        for _ in range(n):
            await alim.consume("bench:k", BIG)
        return (time.perf_counter() - start) / n * 1e6

    return sync, asyncio.run(main())


def hot_key(port: int, cache: bool) -> tuple[int, float]:
    """(round trips, µs per call) for HOT_CALLS retries of a denied request."""
    r = redis.Redis(port=port)
    r.delete("bench:hot")
    lim = Limiter(r, denial_cache=DenialCache(10_000) if cache else None)
    lim.consume("bench:hot", HOT)  # the only token
    r.config_resetstat()
    start = time.perf_counter()
    for _ in range(HOT_CALLS):
        assert not lim.consume("bench:hot", HOT).allowed
    took = time.perf_counter() - start
    trips = int(r.info("commandstats").get("cmdstat_tb.consume", {}).get("calls", 0))
    r.close()
    return trips, took / HOT_CALLS * 1e6


def report() -> str:
    with tempfile.TemporaryDirectory() as tmp:
        server = Server("redis-7.0", Path(tmp), module=True).start()
        try:
            server_version = server.client().info("server")["redis_version"]
            rows = []
            for backend in ("module", "functions"):
                for mode, measure in (("sync", sync_overhead), ("asyncio", async_overhead)):
                    raw, control, lim = measure(server.port, backend)
                    both = "—" if control is None else f"{control:.1f}"
                    rows.append(f"| {backend} | {mode} | {raw:.1f} | {both} | {lim:.1f} | {lim - raw:+.1f} |")
            off = hot_key(server.port, cache=False)
            on = hot_key(server.port, cache=True)
        finally:
            server.stop()
    work_sync, work_async = client_work()
    saved = 1 - on[0] / off[0]
    return "\n".join(
        [
            f"Redis {server_version} with the module on loopback, one connection, Python "
            f"{platform.python_version()}, redis-py {redis.__version__}, redis-tokenbucket "
            f"{version('redis-tokenbucket')}; {platform.machine()}, {os.cpu_count()} cores, shared "
            "with other work, so absolute figures move between runs.",
            "",
            f"Per call, median of {ROUNDS} rounds of {CALLS:,} admitted `consume` calls (µs):",
            "",
            "| backend | API | raw `execute_command` | raw + client work on a stub | `Limiter.consume` | overhead |",
            "|---|---|---|---|---|---|",
            *rows,
            "",
            f"The client's own work per call, no I/O (a stub replies): {work_sync:.1f} µs sync, "
            f"{work_async:.1f} µs asyncio (argument checks, building the command, the Decision). "
            "Where a raw call followed by that same work on a stub costs about what the limiter's "
            "call costs, the overhead is this work, slower between system calls than in a tight "
            "loop (cold caches), and nothing more on the wire.",
            "",
            f"A hot denied key, {HOT_CALLS:,} retries in a tight loop:",
            "",
            "| denial cache | round trips to Redis | µs per call |",
            "|---|---|---|",
            f"| off (default) | {off[0]:,} | {off[1]:.1f} |",
            f"| on | {on[0]:,} | {on[1]:.1f} |",
            "",
            f"The cache saved {saved:.2%} of the round trips: Redis saw one call per retry window.",
        ]
    )


def write_into(readme: Path, text: str) -> None:
    begin, end = "<!-- bench:begin -->", "<!-- bench:end -->"
    content = readme.read_text()
    if begin not in content or end not in content:
        raise SystemExit(f"{readme}: no {begin} ... {end} section")
    head, rest = content.split(begin, 1)
    _, tail = rest.split(end, 1)
    readme.write_text(f"{head}{begin}\n{text}\n{end}{tail}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--readme", type=Path, help="write the report into this file's bench section")
    options = parser.parse_args()
    text = report()
    print(text)
    if options.readme:
        write_section(options.readme, "bench", text)


if __name__ == "__main__":
    main()
