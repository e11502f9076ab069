"""Side by side with `limits` (the library under slowapi and Flask-Limiter),
measured, never asserted (`make bench-python`).

One Redis 7.0 with the module, one process, the same loop for everyone:
calls on 100 keys in turn, each call one decision, all admitted (limits of
10^6 per second). Cases run interleaved, ROUNDS rounds of CALLS decisions
each; decisions/s are medians, and a ratio is the median of the per-round
ratios (the runs it compares are close in time). Server µs and commands
per decision come from INFO commandstats around one more run of each case.

- ours, sync: `Limiter(redis.Redis())` as the README builds it (so with the
  default timeout), and with an explicit `timeout=1.0`;
- limits, sync: fixed window, moving window, sliding window counter;
- asyncio, 50 tasks: ours as the README builds it, `limits.aio`'s fixed
  window on its redis-py implementation;
- the retry loop: one client retrying a denied key, ours with the denial
  cache, limits' fixed window.

Then the package's own share of a sync call (cProfile: the time in
redis_tokenbucket's functions over the whole call).

`limits` is a bench-only dependency: `make bench-python` installs it into
the repository's .venv, never into the package.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
import redis.asyncio
from limits import parse, storage, strategies
from limits.aio import storage as astorage
from limits.aio import strategies as astrategies

sys.path.append(str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.append(str(Path(__file__).resolve().parents[3] / "bench"))
from doc_section import write_section
from tbservers import Server

import redis_tokenbucket.asyncio as tb_asyncio
from redis_tokenbucket import Bucket, Limiter

CALLS = 3000
ROUNDS = 7
TASKS = 50
KEYS = [f"bench:peer:{i}" for i in range(100)]
BIG = Bucket(1e6, 1e6)
ITEM = parse("1000000/second")
DENIED_B = Bucket(1, 0.001)
DENIED_ITEM = parse("1/hour")


def sync_case(call: Callable[[str], Any], prefix: str) -> Callable[[int], float]:
    keys = [f"{prefix}:{k}" for k in KEYS]  # each case its own keys (windows differ in type)

    def run(n: int) -> float:
        start = time.perf_counter()
        for i in range(n):
            call(keys[i % 100])
        return n / (time.perf_counter() - start)

    return run


def async_case(make: Callable[[], Any], prefix: str) -> Callable[[int], float]:
    """`make()` (on the loop) returns an async call(key); TASKS tasks share n calls."""

    def run(n: int) -> float:
        async def main() -> float:
            call, close = await make()
            per = n // TASKS

            async def worker(w: int) -> None:
                for i in range(per):
                    await call(f"{prefix}:{KEYS[(w + i) % 100]}")

            await call(f"{prefix}:{KEYS[0]}")  # connected
            start = time.perf_counter()
            await asyncio.gather(*(worker(w) for w in range(TASKS)))
            rate = per * TASKS / (time.perf_counter() - start)
            await close()
            return rate

        return asyncio.run(main())

    return run


def cases(port: int) -> dict[str, Callable[[int], float]]:
    url = f"redis://127.0.0.1:{port}"
    ours = Limiter(redis.Redis(port=port))
    ours_t = Limiter(redis.Redis(port=port), timeout=1.0)
    st = storage.RedisStorage(url)
    fixed = strategies.FixedWindowRateLimiter(st)
    moving = strategies.MovingWindowRateLimiter(st)
    sliding = strategies.SlidingWindowCounterRateLimiter(st)

    async def make_ours() -> Any:
        client = redis.asyncio.Redis(port=port)
        lim = tb_asyncio.Limiter(client)

        async def close() -> None:
            await lim.aclose()
            await client.aclose()

        return (lambda k: lim.consume(k, BIG)), close

    async def make_limits() -> Any:
        ast = astorage.RedisStorage(f"async+{url}", implementation="redispy")
        lim = astrategies.FixedWindowRateLimiter(ast)

        async def close() -> None:
            pass

        return (lambda k: lim.hit(ITEM, k)), close

    return {
        "ours sync": sync_case(lambda k: ours.consume(k, BIG), "ours"),
        "ours sync timeout=1.0": sync_case(lambda k: ours_t.consume(k, BIG), "ours1"),
        "limits fixed window": sync_case(lambda k: fixed.hit(ITEM, k), "fixed"),
        "limits moving window": sync_case(lambda k: moving.hit(ITEM, k), "moving"),
        "limits sliding window counter": sync_case(lambda k: sliding.hit(ITEM, k), "sliding"),
        "ours asyncio": async_case(make_ours, "aours"),
        "limits.aio fixed window": async_case(make_limits, "afixed"),
    }


def server_cost(server: Server, run: Callable[[int], float]) -> tuple[float, float]:
    """(server µs, commands) per decision, from INFO commandstats."""
    with server.client() as admin:
        admin.config_resetstat()
        run(CALLS)
        stats = admin.info("commandstats")
    calls = sum(int(v["calls"]) for k, v in stats.items() if not k.endswith(("config|resetstat", "_info")))
    usec = sum(float(v["usec"]) for k, v in stats.items() if not k.endswith(("config|resetstat", "_info")))
    return usec / CALLS, calls / CALLS


def retry_loop(server: Server) -> dict[str, tuple[float, float]]:
    """Decisions/s (the median of ROUNDS interleaved rounds, as the table
    above) and commands per decision for one client retrying a denied key."""
    port = server.port
    ours = Limiter(redis.Redis(port=port), denial_cache=1000)
    fixed = strategies.FixedWindowRateLimiter(storage.RedisStorage(f"redis://127.0.0.1:{port}"))
    ours.consume("bench:denied:ours", DENIED_B)
    fixed.hit(DENIED_ITEM, "bench:denied:limits")
    calls: dict[str, Callable[[], Any]] = {
        "ours, denial cache": lambda: ours.consume("bench:denied:ours", DENIED_B),
        "limits fixed window": lambda: fixed.hit(DENIED_ITEM, "bench:denied:limits"),
    }
    tries = 20_000
    rates: dict[str, list[float]] = {name: [] for name in calls}
    commands: dict[str, int] = dict.fromkeys(calls, 0)
    for _ in range(ROUNDS):
        for name, call in calls.items():
            with server.client() as admin:
                admin.config_resetstat()
                start = time.perf_counter()
                for _ in range(tries):
                    call()
                rates[name].append(tries / (time.perf_counter() - start))
                stats = admin.info("commandstats")
            commands[name] += sum(int(v["calls"]) for k, v in stats.items() if not k.endswith("config|resetstat"))
    return {name: (statistics.median(rates[name]), commands[name] / (tries * ROUNDS)) for name in calls}


def own_share(port: int) -> tuple[float, float]:
    """The package's own share of a consume, by cProfile (tottime): sync,
    and asyncio with TASKS tasks (the event loop's own work counted in the
    whole)."""
    lim = Limiter(redis.Redis(port=port))
    prof = cProfile.Profile()
    prof.enable()
    for i in range(5000):
        lim.consume(KEYS[i % 100], BIG)
    prof.disable()
    aprof = cProfile.Profile()

    async def main() -> None:
        client = redis.asyncio.Redis(port=port)
        alim = tb_asyncio.Limiter(client)
        await alim.consume(KEYS[0], BIG)  # connected

        async def worker(w: int) -> None:
            for i in range(5000 // TASKS):
                await alim.consume(KEYS[(w + i) % 100], BIG)

        aprof.enable()
        await asyncio.gather(*(worker(w) for w in range(TASKS)))
        aprof.disable()
        await alim.aclose()
        await client.aclose()

    asyncio.run(main())
    return share(prof), share(aprof)


def share(prof: cProfile.Profile) -> float:
    stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]
    total = sum(v[2] for v in stats.values())
    own = sum(v[2] for k, v in stats.items() if "redis_tokenbucket" in k[0])
    return float(own / total)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--report", type=Path)
    parser.add_argument("--readme", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        server = Server("redis-7.0", Path(tmp), module=True).start()
        try:
            table = cases(server.port)
            rounds: dict[str, list[float]] = {name: [] for name in table}
            for _ in range(ROUNDS):
                for name, run in table.items():
                    rounds[name].append(run(CALLS))
            costs = {name: server_cost(server, run) for name, run in table.items()}
            loop = retry_loop(server)
            share = own_share(server.port)
        finally:
            server.stop()
    text = report(rounds, costs, loop, share)
    print(text)
    if args.report:
        write_section(args.report, "bench-peers", text, "The Python client against its peers")
    if args.readme:
        # The README's comparison carries the same measured rows.
        write_section(args.readme, "bench-peers", text)


def ratio(rounds: dict[str, list[float]], a: str, b: str) -> float:
    return statistics.median(x / y for x, y in zip(rounds[a], rounds[b], strict=True))


def report(
    rounds: dict[str, list[float]],
    costs: dict[str, tuple[float, float]],
    loop: dict[str, tuple[float, float]],
    share: tuple[float, float],
) -> str:
    import limits

    med = {k: statistics.median(v) for k, v in rounds.items()}
    sync_ratio = ratio(rounds, "ours sync", "limits fixed window")
    sync_t_ratio = ratio(rounds, "ours sync timeout=1.0", "limits fixed window")
    async_ratio = ratio(rounds, "ours asyncio", "limits.aio fixed window")
    us_ratio = costs["ours sync"][0] / costs["limits moving window"][0]
    loop_ratio = loop["ours, denial cache"][0] / loop["limits fixed window"][0]

    def mark(ok: bool) -> str:
        return "PASS" if ok else "MISS"

    rows = [
        "",
        f"`make bench-python` ({time.strftime('%Y-%m-%d')}): Redis 7.0 with the module on loopback, Python "
        f"{sys.version.split()[0]}, redis-py {redis.__version__}, limits {limits.__version__}; {ROUNDS} interleaved "
        f"rounds of {CALLS:,} decisions on 100 keys, medians; ratios are medians of per-round ratios. asyncio: "
        f"{TASKS} tasks. A shared 2-core machine: compare within the table, not across runs.",
        "",
        "| case | decisions/s | server µs per decision | commands per decision |",
        "|---|---:|---:|---:|",
    ]
    for name in rounds:
        us, cmds = costs[name]
        rows.append(f"| {name} | {med[name]:,.0f} | {us:.1f} | {cmds:.1f} |")
    rows += [
        "",
        f"| retry loop on a denied key (median of {ROUNDS} rounds) | decisions/s | commands per decision |",
        "|---|---:|---:|",
    ]
    for name, (rate, cmds) in loop.items():
        rows.append(f"| {name} | {rate:,.0f} | {cmds:.4f} |")
    rows += [
        "",
        "| target | measured | |",
        "|---|---:|---|",
        f"| sync, README construction (default timeout) >= 1.0x limits fixed window | {sync_ratio:.2f}x | "
        f"{mark(sync_ratio >= 1.0)} |",
        f"| sync, `timeout=1.0` >= 1.0x limits fixed window | {sync_t_ratio:.2f}x | {mark(sync_t_ratio >= 1.0)} |",
        f"| asyncio, README construction >= 1.5x limits.aio fixed window | {async_ratio:.2f}x | "
        f"{mark(async_ratio >= 1.5)} |",
        f"| server µs per decision <= 0.5x limits moving window, 1 command | {us_ratio:.2f}x, "
        f"{costs['ours sync'][1]:.1f} command | {mark(us_ratio <= 0.5 and costs['ours sync'][1] <= 1.0)} |",
        f"| retry loop >= 10x limits fixed window (denial cache) | {loop_ratio:.1f}x | {mark(loop_ratio >= 10)} |",
        "",
        f"The package's own share of a `consume` (cProfile, tottime of redis_tokenbucket's functions over "
        f"the whole call): {share[0]:.1%} sync, {share[1]:.1%} asyncio with {TASKS} tasks (the event loop's "
        "own work in the whole).",
        "",
    ]
    return "\n".join(rows)


if __name__ == "__main__":
    main()
