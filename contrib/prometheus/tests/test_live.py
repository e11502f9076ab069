"""End to end: Redis 7.0, Debian's redis_exporter with tb-collect.lua, and
Debian's Prometheus scraping it every second with tb-rules.yml loaded, and
scraping a gateway's metrics endpoint too: the Python package's limiters
with the example's hook (python/tb_metrics.py). Known traffic goes in;
Prometheus's HTTP API must show it exactly.

Run twice: with the module, and with the Lua library on a server without
it (as on managed Redis), where the tb_* series don't exist and the
redis_commands_* series for FCALL, and the gateway's series, are what
there is to watch.

Every wait polls with a generous deadline and returns as soon as its
condition holds; nothing here measures time."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from prometheus_client import CollectorRegistry
from redis_tokenbucket import Breaker, Bucket, Concurrency, Limiter

import dashboard
from promstack import LUA_LIBRARY, Exporter, MetricsEndpoint, Prometheus, Server, free_port, wait_for
from tb_metrics import TokenBucketMetrics

ADMITTED, DENIED = 25, 7  # N and M: a bucket of N tokens, N + M calls
PEEKS, ADJUSTS, ERRORS = 3, 2, 2
# A refill so slow that no test lives long enough to see a token back.
SLOW = 0.001

# The gateway's traffic, through the Python package: its own N and M, and
# cached denials (the denial cache answers them: Redis never sees them).
PY_ADMITTED, PY_DENIED, PY_CACHED = 9, 4, 5
STREAMS = Concurrency(3, 60_000, name="streams")
GENEROUS = 10.0  # seconds


@dataclass
class Stack:
    redis: Server
    exporter: Exporter
    prometheus: Prometheus
    gateway: Gateway

    def stop(self) -> None:
        self.prometheus.stop()
        self.gateway.stop()
        self.exporter.stop()
        self.redis.stop()


class Gateway:
    """What a gateway process runs: the Python package's limiters, each
    with the example's hook and watched by it, and the metrics endpoint."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.metrics = TokenBucketMetrics(self.registry)
        self.endpoint = MetricsEndpoint(self.registry)
        self.limiters: list[Limiter] = []

    def limiter(self, name: str, client: redis.Redis, **options: Any) -> Limiter:
        # A budget no loaded machine misses: every answer here must be Redis's.
        options.setdefault("timeout", GENEROUS)
        lim = Limiter(client, on_decision=self.metrics.on_decision, **options)
        self.metrics.watch(lim, name)
        self.limiters.append(lim)
        return lim

    def stop(self) -> None:
        self.endpoint.stop()
        for lim in self.limiters:
            lim.close()


def start_stack(workdir: Path, module: bool) -> Stack:
    server = Server("redis-7.0", workdir / "redis", module=module).start()
    exporter = prometheus = gateway = None
    try:
        exporter = Exporter(workdir / "exporter", server.port).start()
        gateway = Gateway()
        prometheus = Prometheus(workdir / "prometheus", [exporter.address], gateways=(gateway.endpoint.address,))
        prometheus.start()
        # The first scrapes: from here on, what Redis and the gateway count
        # reaches Prometheus.
        prometheus.settles("redis_up", 1)
        prometheus.settles('up{job="gateway"}', 1)
        return Stack(server, exporter, prometheus, gateway)
    except BaseException:
        for p in (prometheus, gateway, exporter, server):
            if p is not None:
                p.stop()
        raise


@pytest.fixture
def module_stack(tmp_path: Path) -> Iterator[Stack]:
    stack = start_stack(tmp_path, module=True)
    yield stack
    stack.stop()


@pytest.fixture
def lua_stack(tmp_path: Path) -> Iterator[Stack]:
    stack = start_stack(tmp_path, module=False)
    yield stack
    stack.stop()


def check_dashboard(prom: Prometheus, module: bool) -> None:
    """Every dashboard query parses and runs on this Prometheus, and each of
    its series selectors matches series this run produced (tb-rls's
    aside); without the module, exactly the selectors of
    redis_script_values match nothing."""
    board = dashboard.load()
    for query in dashboard.queries(board):
        prom.query(query.expr)  # raises on anything Prometheus refuses
        for selector in query.selectors():
            # No tb-rls runs here: test_dashboard.py checks its names
            # against rls/src/metrics.rs, rls/tests/metrics.rs its values.
            if dashboard.RLS_PREFIX in selector:
                continue
            found = prom.series(selector)
            if module or "redis_script_values" not in selector:
                assert found, f"{query.where}: {selector} matches no series"
            else:
                assert not found, f"{query.where}: {selector} matches {found}"


@dataclass(frozen=True)
class GatewayCounts:
    """What the gateway's traffic must show in Prometheus."""

    decisions: dict[tuple[str, str, str], float]  # (op, policy, outcome)
    latencies: dict[tuple[str, str], float]  # (op, backend): observations
    leases_held: dict[str, float]  # by limiter
    breakers: dict[str, str]  # limiter: the state whose series is 1


def gateway_traffic(stack: Stack, backend: str) -> GatewayCounts:
    """Known traffic through the Python package, with every outcome the
    hook knows: admitted and denied by Redis, cached denials, degraded
    answers (a Redis that refuses connections), a shed call (a pool whose
    one connection is taken), and leases: acquired (one id twice), busy,
    renewed, released, and one lost to another holder's release."""
    gw, port = stack.gateway, stack.redis.port
    user, ip = Bucket(PY_ADMITTED, SLOW, name="user"), Bucket(1, SLOW, name="ip")

    plain = gw.limiter("plain", redis.Redis(port=port))
    out = [plain.consume("py:user", user) for _ in range(PY_ADMITTED + PY_DENIED)]
    assert [d.allowed for d in out] == [True] * PY_ADMITTED + [False] * PY_DENIED

    cached = gw.limiter("cached", redis.Redis(port=port), denial_cache=100)
    out = [cached.consume("py:ip", ip) for _ in range(2 + PY_CACHED)]
    assert [(d.allowed, d.cached) for d in out] == [(True, False), (False, False)] + [(False, True)] * PY_CACHED

    # Nothing listens there: refused, a Redis failure. The breaker opens at
    # the second failure and stays open (no probe for an hour), so the third
    # call gets its policy at once.
    down = gw.limiter("down", redis.Redis(port=free_port()), breaker=Breaker(failures=2, window=3600, cooldown=3600))
    out = [down.consume("py:user", user, on_error=p) for p in ("open", "closed", "open")]
    assert [(d.allowed, d.degraded) for d in out] == [(True, True), (False, True), (True, True)]
    assert down.breaker_state == "open"

    # One connection in the pool, taken: no connection free, the call is shed.
    client = redis.Redis(port=port, max_connections=1)
    crowded = gw.limiter("crowded", client, timeout=None)
    taken = client.connection_pool.get_connection("PING")
    try:
        shed = crowded.consume("py:user", user, on_error="open")
    finally:
        client.connection_pool.release(taken)
    assert shed.shed and not shed.allowed and not shed.degraded

    # Leases: a, b, c (and a again: a retry, held once), then busy; a and b
    # renewed, b released; c released by another holder, so its renewal
    # finds it lost. Left held: a.
    a, b, c = (plain.acquire("py:streams", STREAMS, id=i) for i in ("a", "b", "c"))
    retry = plain.acquire("py:streams", STREAMS, id="a")
    busy = plain.acquire("py:streams", STREAMS)
    assert [x.acquired for x in (a, b, c, retry, busy)] == [True, True, True, True, False] and busy.busy
    assert plain.renew(a) and plain.renew(b) and plain.release(b)
    with Limiter(redis.Redis(port=port), timeout=GENEROUS) as other:
        assert other.release(c)
    assert plain.renew(c) is False and c.lost
    assert plain.in_flight("py:streams") == 1 and plain.leases_held == 1

    return GatewayCounts(
        decisions={
            ("consume", "user", "admitted"): PY_ADMITTED,
            ("consume", "user", "denied"): PY_DENIED,
            ("consume", "ip", "admitted"): 1,
            ("consume", "ip", "denied"): 1,
            ("consume", "ip", "cached_denial"): PY_CACHED,
            ("consume", "user", "degraded_admitted"): 2,
            ("consume", "user", "degraded_denied"): 1,
            ("consume", "user", "shed"): 1,
            ("acquire", "streams", "admitted"): 4,
            ("acquire", "streams", "denied"): 1,
        },
        latencies={
            # The cached denials: answered by the limiter whose backend is known.
            ("consume", backend): PY_ADMITTED + PY_DENIED + 2 + PY_CACHED,
            ("consume", "none"): 3 + 1,  # the policy's answers and the shed call
            ("acquire", backend): 5,
        },
        leases_held={"plain": 1, "cached": 0, "down": 0, "crowded": 0},
        breakers={"plain": "closed", "cached": "closed", "down": "open", "crowded": "closed"},
    )


def check_gateway(prom: Prometheus, expected: GatewayCounts) -> None:
    """The gateway's series in Prometheus, exactly as its traffic was."""
    decisions = "sum by (op, policy, outcome) (redis_tokenbucket_decisions_total)"
    wait_for(decisions, lambda: prom.table(decisions, "op", "policy", "outcome"), lambda v: v == expected.decisions)
    latencies = "sum by (op, backend) (redis_tokenbucket_decision_duration_seconds_count)"
    wait_for(latencies, lambda: prom.table(latencies, "op", "backend"), lambda v: v == expected.latencies)
    # Every observation is in the histogram's last bucket.
    inf = 'sum by (op, backend) (redis_tokenbucket_decision_duration_seconds_bucket{le="+Inf"})'
    wait_for(inf, lambda: prom.table(inf, "op", "backend"), lambda v: v == expected.latencies)
    leases = "redis_tokenbucket_leases_held"
    wait_for(
        leases, lambda: prom.table(leases, "limiter"), lambda v: v == {(k,): n for k, n in expected.leases_held.items()}
    )
    # One state per limiter at 1, the two others at 0.
    states = "sum by (limiter, state) (redis_tokenbucket_breaker_state)"
    breakers = {(name, state): float(expected.breakers[name] == state) for name in expected.breakers
                for state in ("closed", "open", "half_open")}  # fmt: skip
    wait_for(states, lambda: prom.table(states, "limiter", "state"), lambda v: v == breakers)
    # Low cardinality: no key, no lease id reached a label.
    for series in prom.series('{__name__=~"redis_tokenbucket_.+"}'):
        assert not any("py:" in value or value in ("a", "b", "c") for value in series.values()), series


def test_module_counters_reach_prometheus_exactly(module_stack: Stack) -> None:
    prom, key = module_stack.prometheus, "rl:e2e"
    with module_stack.redis.client() as c:
        # One admitted TB.MCONSUME and one admitted CL.THROTTLE (0: allowed),
        # then a bucket of ADMITTED - 2 tokens: ADMITTED admitted in all.
        assert c.execute_command("TB.MCONSUME", "rl:m", 10, SLOW, 1)[0] == 1
        assert c.execute_command("CL.THROTTLE", "rl:c", 10, 10, 60)[0] == 0
        size = ADMITTED - 2
        consumes = size + DENIED
        replies = [c.execute_command("TB.CONSUME", key, size, SLOW) for _ in range(consumes)]
        assert [r[0] for r in replies] == [1] * size + [0] * DENIED
        for _ in range(PEEKS):
            c.execute_command("TB.PEEK", key, size, SLOW)
        for _ in range(ADJUSTS):
            c.execute_command("TB.ADJUST", key, size, SLOW, 1)
        for _ in range(ERRORS):
            with pytest.raises(redis.ResponseError, match="rate"):
                c.execute_command("TB.CONSUME", key, size, "fast")
        info = c.info("tb")

    # What the module counted: INFO tb, every numeric field of it.
    counters = {k: float(v) for k, v in info.items() if k.startswith("tb_") and isinstance(v, (int, float))}
    expected = {"tb_admitted": ADMITTED, "tb_denied": DENIED, "tb_peeks": PEEKS,
                "tb_adjusts": ADJUSTS, "tb_errors": ERRORS, "tb_panics": 0}  # fmt: skip
    assert {k: counters[k] for k in expected} == expected

    # ... reaches Prometheus as redis_script_values, every field, exactly.
    wait_for("redis_script_values by key", lambda: prom.values("redis_script_values", "key"), lambda v: v == counters)
    prom.settles('redis_script_values{key="tb_admitted"}', ADMITTED)
    prom.settles('redis_script_values{key="tb_denied"}', DENIED)
    # The exporter's own series for the module's commands (INFO commandstats).
    prom.settles('redis_commands_total{cmd="tb.consume"}', consumes + ERRORS)
    prom.settles('redis_commands_total{cmd="tb.mconsume"}', 1)
    prom.settles('redis_commands_total{cmd="cl.throttle"}', 1)
    prom.settles('redis_commands_failed_calls_total{cmd="tb.consume"}', ERRORS)
    prom.settles('redis_commands_total{cmd="tb.peek"}', PEEKS)
    prom.settles('redis_commands_total{cmd="tb.adjust"}', ADJUSTS)
    wait_for("TB.CONSUME's time", lambda: prom.value('redis_commands_duration_seconds_total{cmd="tb.consume"}'),
             lambda v: v is not None and v > 0)  # fmt: skip
    prom.settles_on_labels('redis_latency_percentiles_usec{cmd="tb.consume"}', "quantile", {"50", "99", "99.9"})
    # INFO ALL, which the exporter sends, has no module sections: no tb_*
    # reaches Prometheus but through the script.
    names = prom.api("label/__name__/values")
    assert "redis_script_values" in names
    assert [n for n in names if n.startswith(("tb_", "redis_tb"))] == []

    # The gateway: its own series exactly; and on the server, what of its
    # traffic reached Redis: its admitted and denied calls (not the cached,
    # degraded or shed ones), and its leases.
    check_gateway(prom, gateway_traffic(module_stack, "module"))
    with module_stack.redis.client() as c:
        after = {k: float(v) for k, v in c.info("tb").items() if k.startswith("tb_") and isinstance(v, (int, float))}
    leases = {"tb_acquired": 4, "tb_busy": 1, "tb_renewed": 2, "tb_released": 2, "tb_inflights": 1}
    assert after == {**counters, "tb_admitted": ADMITTED + PY_ADMITTED + 1, "tb_denied": DENIED + PY_DENIED + 1,
                     **leases}  # fmt: skip
    wait_for("redis_script_values by key", lambda: prom.values("redis_script_values", "key"), lambda v: v == after)
    for key, count in leases.items():
        prom.settles(f'redis_script_values{{key="{key}"}}', count)
    prom.settles('redis_commands_total{cmd="tb.acquire"}', 5)
    prom.settles('redis_commands_total{cmd="tb.renew"}', 3)
    prom.settles('redis_commands_total{cmd="tb.release"}', 2)
    prom.settles('redis_commands_total{cmd="tb.inflight"}', 1)

    check_dashboard(prom, module=True)

    # The rules load and evaluate on these series; the denied share is
    # every denied call over every decided one, the busy share 1 of 5.
    groups = prom.api("rules")["groups"]
    assert [g["name"] for g in groups] == ["redis-tokenbucket"]
    assert all(r["health"] == "ok" for r in groups[0]["rules"]), groups
    share = after["tb_denied"] / (after["tb_admitted"] + after["tb_denied"])
    wait_for("tb:denied_share:rate5m", lambda: prom.value("tb:denied_share:rate5m"),
             lambda v: v is not None and abs(v - share) < 1e-9)  # fmt: skip
    wait_for("tb:busy_share:rate5m", lambda: prom.value("tb:busy_share:rate5m"),
             lambda v: v is not None and abs(v - 1 / 5) < 1e-9)  # fmt: skip

    # Calls Redis refuses before the module runs: rejected, not the module's
    # errors. Out of memory, the scrapes go on (the script only reads).
    with module_stack.redis.client() as c:
        c.acl_setuser("nolimiter", enabled=True, passwords=["+pw"], keys=["*"], commands=["+@all", "-tb.consume"])
        user = redis.Redis(port=module_stack.redis.port, username="nolimiter", password="pw")
        with user, pytest.raises(redis.exceptions.NoPermissionError):
            user.execute_command("TB.CONSUME", key, size, SLOW)
        c.config_set("maxmemory-policy", "noeviction")
        c.config_set("maxmemory", 1)
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            c.execute_command("TB.CONSUME", "rl:new", size, SLOW)
    prom.settles('redis_commands_rejected_calls_total{cmd="tb.consume"}', 2)
    prom.settles('redis_script_values{key="tb_errors"}', ERRORS)
    prom.settles("redis_up", 1)

    # Redis gone: redis_up 0, and TokenBucketRedisDown pending (for: 1m).
    module_stack.redis.stop()
    prom.settles("redis_up", 0)
    wait_for("TokenBucketRedisDown", lambda: alert_states(prom, "TokenBucketRedisDown"), lambda s: s == ["pending"])
    assert alert_states(prom, "TokenBucketPanics") == []


def alert_states(prom: Prometheus, name: str) -> list[str]:
    return [a["state"] for a in prom.api("alerts")["alerts"] if a["labels"]["alertname"] == name]


def test_lua_library_shows_as_fcall_and_the_script_does_not_fail(lua_stack: Stack) -> None:
    prom, key = lua_stack.prometheus, "rl:e2e"
    with lua_stack.redis.client() as c:
        c.function_load(LUA_LIBRARY.read_text(), replace=True)
        replies = [c.fcall("tb_consume", 1, key, ADMITTED, SLOW) for _ in range(ADMITTED + DENIED)]
        assert [r[0] for r in replies] == [1] * ADMITTED + [0] * DENIED
        for _ in range(PEEKS):
            c.fcall_ro("tb_peek", 1, key, ADMITTED, SLOW)
        for _ in range(ERRORS):
            with pytest.raises(redis.ResponseError, match="rate"):
                c.fcall("tb_consume", 1, key, ADMITTED, "fast")

    # FCALL counts every function call on the server, the limiter's here.
    calls = ADMITTED + DENIED + ERRORS
    prom.settles('redis_commands_total{cmd="fcall"}', calls)
    prom.settles('redis_commands_total{cmd="fcall_ro"}', PEEKS)
    prom.settles('redis_commands_failed_calls_total{cmd="fcall"}', ERRORS)
    prom.settles_on_labels('redis_latency_percentiles_usec{cmd="fcall"}', "quantile", {"50", "99", "99.9"})

    # The gateway's series: the same as with the module, from the Functions
    # library. They are the decisions there are to count on managed Redis.
    check_gateway(prom, gateway_traffic(lua_stack, "functions"))

    # No module: no tb_* series at all, and the script did not fail the
    # scrapes (the exporter would report redis_up 0 and a scrape error).
    assert prom.series("redis_script_values") == []
    prom.settles("min_over_time(redis_up[1h])", 1)
    prom.settles("max_over_time(redis_exporter_last_scrape_error[1h])", 0)
    prom.settles('redis_commands_failed_calls_total{cmd="eval"}', 0)

    check_dashboard(prom, module=False)
