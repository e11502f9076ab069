"""`make bench-litellm`: the same load through two LiteLLM proxies sharing
one Redis (7.0, with the module), three ways: no limiter, LiteLLM's own
(the router's deployment rpm and max_parallel_requests, counted in Redis
by usage-based-routing-v2: its per-key limits need its database), and
redis_tokenbucket.litellm's hook. Says what each admitted against the
exact budget, how many streams ran at once against the cap, the slots
left held, and the latency each adds; writes docs/benchmarks.md.

Runs in the LiteLLM venv (`make test-litellm` makes it), reusing the
tests' proxies and stub (clients/python/tests/tblitellm.py)."""

from __future__ import annotations

import argparse
import asyncio
import datetime
import importlib.metadata
import math
import os
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "clients/python/tests"))
os.environ.setdefault(
    "LITELLM_LOCAL_MODEL_COST_MAP", "True"
)  # never fetch the cost map

# After the path and the environment above: the tests' helpers, unpackaged.
import httpx
import redis
from doc_section import write_section
from redis_tokenbucket import Limiter
from tblitellm import AUTH, Proxy, Stub, chat, config, start_proxies
from tbservers import Server

# The budgets: "fast" admits RPM a minute (a bucket of RPM refilled at
# RPM/60 a second), "slow" (a 4 s stream) PARALLEL at once, and "open"
# (the stub's fast answer under another name) has room for all, so that
# its latency is what checking a limit costs, not what a denial saves.
RPM, PARALLEL, ROOMY = 50, 4, 100_000
CLIENTS, EACH = 20, 8  # the burst on "fast": 160 requests against 50
STREAMS, DROP_AT = 3 * PARALLEL, 20
LAT_CLIENTS, LAT_EACH, ROUNDS = (
    2,
    150,
    10,
)  # the latency load on "open", the ways' rounds interleaved
WAYS = ("none", "built-in", "hook")


@dataclass
class Result:
    way: str
    admitted: int = 0
    statuses: Counter[int] = field(default_factory=Counter)
    seconds: float = 0.0
    peak: int = 0
    streams: Counter[int] = field(default_factory=Counter)
    held: int | None = None
    latencies: list[float] = field(default_factory=list)

    @property
    def budget(self) -> float:
        """The router counts requests in a calendar minute (the burst runs
        inside one); the hook's bucket refills RPM/60 a second as it runs."""
        return RPM if self.way == "built-in" else RPM + RPM / 60 * self.seconds

    def quantile(self, q: float) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


def proxy_config(stub: Stub, way: str) -> dict[str, Any]:
    cfg = config(stub)
    models = [m for m in cfg["model_list"] if m["model_name"] in ("fast", "slow")]
    open_model = {**models[0], "model_name": "open"}
    cfg["model_list"] = [
        *models,
        {**open_model, "litellm_params": dict(open_model["litellm_params"])},
    ]
    if way != "hook":
        cfg["litellm_settings"]["callbacks"] = []
    if way == "built-in":
        caps = {
            "fast": {"rpm": RPM},
            "slow": {"max_parallel_requests": PARALLEL},
            "open": {"rpm": ROOMY},
        }
        for m in cfg["model_list"]:
            m["litellm_params"] = {**m["litellm_params"], **caps[m["model_name"]]}
    return cfg


def hook_rules(port: int) -> dict[str, Any]:
    return {
        "redis_url": f"redis://127.0.0.1:{port}/0",
        "on_error": "closed",
        "models": {
            "fast": {"rpm": RPM},
            "slow": {"parallel": PARALLEL},
            "open": {"rpm": ROOMY},
        },
    }


def wait_for_minute_start_if_late(margin: float = 15.0) -> None:
    """The router's rpm counts a calendar minute: a burst across two would
    have two budgets, so it starts in a minute with time to finish."""
    left = 60 - datetime.datetime.now().second
    if left < margin:
        time.sleep(left + 0.5)


async def burst(proxies: list[Proxy], result: Result) -> None:
    async with httpx.AsyncClient(
        timeout=60, headers=AUTH, limits=httpx.Limits(max_connections=200)
    ) as client:

        async def one(i: int) -> None:
            for j in range(EACH):
                r = await client.post(
                    f"{proxies[(i + j) % 2].url}/v1/chat/completions",
                    json=chat("fast", f"u{i}"),
                )
                result.statuses[r.status_code] += 1

        start = time.monotonic()
        await asyncio.gather(*(one(i) for i in range(CLIENTS)))
        result.seconds = time.monotonic() - start
    result.admitted = result.statuses[200]


async def streams(proxies: list[Proxy], result: Result) -> None:
    """STREAMS streams at once on "slow"; every other one is dropped half
    way (a client going away: late enough that the streams' starts, spread
    by a busy machine, still overlap). The peak is how many admitted
    streams were running at once, from first chunk to last."""
    spans: list[tuple[float, float]] = []
    async with httpx.AsyncClient(timeout=120, headers=AUTH) as client:

        async def one(i: int) -> None:
            body = chat("slow", f"s{i}", stream=True)
            req = client.build_request(
                "POST", f"{proxies[i % 2].url}/v1/chat/completions", json=body
            )
            resp = await client.send(req, stream=True)
            result.streams[resp.status_code] += 1
            try:
                if resp.status_code != 200:
                    await resp.aread()
                    return
                first: float | None = None
                chunks = 0
                async for line in resp.aiter_lines():
                    if line.startswith("data:"):
                        first = first or time.monotonic()
                        chunks += 1
                        if i % 2 and chunks >= DROP_AT:
                            break
                if first is not None:
                    spans.append((first, time.monotonic()))
            finally:
                await resp.aclose()

        await asyncio.gather(*(one(i) for i in range(STREAMS)))
    events = sorted(
        [(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans],
        key=lambda x: (x[0], x[1]),
    )
    running = 0
    for _, step in events:
        running += step
        result.peak = max(result.peak, running)


async def latency(proxies: list[Proxy], result: Result, each: int) -> None:
    async with httpx.AsyncClient(timeout=60, headers=AUTH) as client:

        async def one(i: int) -> None:
            for j in range(each):
                start = time.perf_counter()
                r = await client.post(
                    f"{proxies[(i + j) % 2].url}/v1/chat/completions",
                    json=chat("open", f"l{i}"),
                )
                if r.status_code == 200:
                    result.latencies.append(time.perf_counter() - start)
                else:
                    result.statuses[r.status_code] += 1

        for i in range(
            LAT_CLIENTS
        ):  # each connection opened, and each proxy's path warm, before timing
            await client.post(
                f"{proxies[i % 2].url}/v1/chat/completions", json=chat("open", "warm")
            )
        await asyncio.gather(*(one(i) for i in range(LAT_CLIENTS)))


def slots_held(r: redis.Redis) -> int:
    """The leases live on the hook's parallel keys (TB.INFLIGHT on each)."""
    with Limiter(r) as lim:
        return sum(lim.in_flight(k.decode()) for k in r.scan_iter("llm:*parallel*"))


def start(way: str, stub: Stub, server: Server, workdir: Path) -> list[Proxy]:
    rules = hook_rules(server.port) if way == "hook" else None
    cfg = proxy_config(stub, way)
    if way == "built-in":
        cfg["router_settings"] = {
            "routing_strategy": "usage-based-routing-v2",
            "redis_host": "127.0.0.1",
            "redis_port": server.port,
        }
    return start_proxies(workdir / way, cfg, [rules, rules])


def run_all(stub: Stub, server: Server, workdir: Path) -> dict[str, Result]:
    """All six proxies up together, so that the latency rounds can take
    turns between the ways and the machine's noise falls on each alike;
    then each way's burst and streams, one way at a time."""
    results = {way: Result(way) for way in WAYS}
    proxies: dict[str, list[Proxy]] = {}
    r = server.client()
    try:
        for way in WAYS:
            proxies[way] = start(way, stub, server, workdir)
        for n in range(ROUNDS):
            for way in WAYS[n % len(WAYS) :] + WAYS[: n % len(WAYS)]:
                asyncio.run(latency(proxies[way], results[way], LAT_EACH // ROUNDS))
        for way in WAYS:
            wait_for_minute_start_if_late()
            asyncio.run(burst(proxies[way], results[way]))
            asyncio.run(streams(proxies[way], results[way]))
        deadline = time.monotonic() + 5  # a dropped stream's release is asynchronous
        while (held := slots_held(r)) and time.monotonic() < deadline:
            time.sleep(0.1)
        results["hook"].held = held
    finally:
        for p in (p for ps in proxies.values() for p in ps):
            p.stop()
        r.close()
    return results


def unwrapped(text: str) -> str:
    """`text` with each paragraph and list item on one line, which
    write_section wraps (it leaves lines within its width as they are)."""
    out: list[str] = []
    for line in text.split("\n"):
        joins = (
            out
            and out[-1]
            and not out[-1].startswith("|")
            and line
            and not line.startswith(("|", "- "))
        )
        if joins:
            out[-1] += " " + line.strip()
        else:
            out.append(line)
    return "\n".join(out)


def report(results: dict[str, Result]) -> str:
    base, built, hook = results["none"], results["built-in"], results["hook"]
    rows = []
    for res in results.values():
        limited = res.way != "none"
        fives = sum(n for s, n in res.statuses.items() if s >= 500) + sum(
            n for s, n in res.streams.items() if s >= 500
        )
        add50 = res.quantile(0.5) - base.quantile(0.5)
        add99 = res.quantile(0.99) - base.quantile(0.99)
        rows.append(
            f"| {res.way} | {res.admitted} | {f'{res.budget:.1f}' if limited else '-'} "
            f"| {res.statuses[429]} | {fives} | {res.peak} | {PARALLEL if limited else '-'} "
            f"| {res.streams[429]} | {'-' if res.held is None else res.held} "
            f"| {res.quantile(0.5):.1f} | {res.quantile(0.99):.1f} "
            f"| {f'{add50:+.1f}' if limited else '-'} | {f'{add99:+.1f}' if limited else '-'} |"
        )

    def exact(res: Result) -> bool:
        return RPM - 1 <= res.admitted <= math.floor(res.budget) + 1

    checks = [
        ("hook: requests admitted within one of the exact budget", exact(hook)),
        (
            "hook: parallel streams within one of the cap",
            abs(hook.peak - PARALLEL) <= 1,
        ),
        ("hook: 0 parallel slots held after the load", hook.held == 0),
        (
            "hook: added p50 at most the built-in's",
            hook.quantile(0.5) - base.quantile(0.5)
            <= built.quantile(0.5) - base.quantile(0.5),
        ),
    ]
    marks = [f"{'PASS' if ok else 'MISS'} {what}" for what, ok in checks]
    built_exact = exact(built) and abs(built.peak - PARALLEL) <= 1
    today = datetime.date.today().isoformat()
    per_instance = (
        f": {PARALLEL} in each instance, as if each counted its own"
        if built.peak == 2 * PARALLEL
        else ""
    )
    version = importlib.metadata.version("litellm")
    return unwrapped(f"""`make bench-litellm`, {today}: the LiteLLM proxy (litellm {version}) in two instances
sharing one Redis 7.0 with the module, in front of the tests' OpenAI-compatible stub
(clients/python/tests/tbllmstub.py), three ways:
no limiter; LiteLLM's own, the router's deployment `rpm` and `max_parallel_requests` (litellm_params) with
`routing_strategy: usage-based-routing-v2` counting in the same Redis (its per-key limits need its database);
and this package's hook (`redis_tokenbucket.litellm.hook`) with the same caps as `models:` rules.

The load: {CLIENTS} clients sending {EACH} requests each at once to "fast" ({CLIENTS * EACH} requests, half
to each instance) against {RPM} a minute; then {STREAMS} streams at once on "slow" (4 s each, every other one
dropped after {DROP_AT} chunks of 40) against {PARALLEL} in parallel; the latency is {LAT_CLIENTS} clients
sending {LAT_EACH} requests each to a model whose limits leave room for all
(what checking costs, not what denying saves).

The latency runs first, in {ROUNDS} rounds taking turns between the three ways (all six proxies up), so
that the machine's noise falls on each alike; the machine was shared with other work (2 cores), so the
latencies are noisy all the same. The budget is the exact one: for the hook, {RPM} plus the refill over the
burst's duration; for the built-in, which counts a calendar minute, {RPM} (the burst runs inside one minute).

The targets:

- requests and parallel streams exact within one of the budget and the cap, across both instances, where
  the built-in is not
- 0 parallel slots held after the load (TB.INFLIGHT on the hook's keys)
- the p50 the hook adds per request at most what the built-in adds

| limiter | admitted | budget | 429 | 5xx | streams at once | cap | streams 429 | slots held | p50 ms | p99 ms \
| added p50 ms | added p99 ms |
|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|
{chr(10).join(rows)}

{chr(10).join(f"- {m}" for m in marks)}
- the built-in {"was" if built_exact else "was not"} within one of both ({built.admitted} admitted against
  {built.budget:.1f}, {built.peak} streams at once against {PARALLEL}{per_instance})
""")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--report", type=Path, help="write the section into this Markdown file"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-litellm-") as tmp:
        workdir = Path(tmp)
        stub = Stub(workdir / "stub")
        server = Server("redis-7.0", workdir / "redis", module=True).start()
        try:
            results = run_all(stub, server, workdir)
        finally:
            server.stop()
            stub.stop()
    for res in results.values():
        print(
            res.way,
            dict(res.statuses),
            dict(res.streams),
            f"peak={res.peak} held={res.held}",
            flush=True,
        )
    text = report(results)
    print(text)
    if args.report:
        write_section(
            args.report,
            "bench-litellm",
            text,
            "LiteLLM: the hook against its own limiter",
        )


if __name__ == "__main__":
    main()
