"""End to end: Redis 7.0, Debian's redis_exporter with tb-collect.lua, and
Debian's Prometheus scraping it every second with tb-rules.yml loaded.
Known traffic goes in; Prometheus's HTTP API must show it exactly.

Run twice: with the module, and with the Lua library on a server without
it (as on managed Redis), where the tb_* series don't exist and the
redis_commands_* series for FCALL are what there is to watch.

Every wait polls with a generous deadline and returns as soon as its
condition holds; nothing here measures time."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

import dashboard
from promstack import LUA_LIBRARY, Exporter, Prometheus, Server, wait_for

ADMITTED, DENIED = 25, 7  # N and M: a bucket of N tokens, N + M calls
PEEKS, ADJUSTS, ERRORS = 3, 2, 2
# A refill so slow that no test lives long enough to see a token back.
SLOW = 0.001


@dataclass
class Stack:
    redis: Server
    exporter: Exporter
    prometheus: Prometheus

    def stop(self) -> None:
        self.prometheus.stop()
        self.exporter.stop()
        self.redis.stop()


def start_stack(workdir: Path, module: bool) -> Stack:
    server = Server("redis-7.0", workdir / "redis", module=module).start()
    exporter = prometheus = None
    try:
        exporter = Exporter(workdir / "exporter", server.port).start()
        prometheus = Prometheus(workdir / "prometheus", [exporter.address]).start()
        # The first scrape: from here on, what Redis counts reaches Prometheus.
        prometheus.settles("redis_up", 1)
        return Stack(server, exporter, prometheus)
    except BaseException:
        for p in (prometheus, exporter, server):
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
    its series selectors matches series this run produced; without the
    module, exactly the selectors of redis_script_values match nothing."""
    board = dashboard.load()
    for query in dashboard.queries(board):
        prom.query(query.expr)  # raises on anything Prometheus refuses
        for selector in query.selectors():
            found = prom.series(selector)
            if module or "redis_script_values" not in selector:
                assert found, f"{query.where}: {selector} matches no series"
            else:
                assert not found, f"{query.where}: {selector} matches {found}"


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

    check_dashboard(prom, module=True)

    # The rules load and evaluate on these series; the denied share is N/(N+M).
    groups = prom.api("rules")["groups"]
    assert [g["name"] for g in groups] == ["redis-tokenbucket"]
    assert all(r["health"] == "ok" for r in groups[0]["rules"]), groups
    share = DENIED / (ADMITTED + DENIED)
    wait_for("tb:denied_share:rate5m", lambda: prom.value("tb:denied_share:rate5m"),
             lambda v: v is not None and abs(v - share) < 1e-9)  # fmt: skip

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

    # No module: no tb_* series at all, and the script did not fail the
    # scrapes (the exporter would report redis_up 0 and a scrape error).
    assert prom.series("redis_script_values") == []
    prom.settles("min_over_time(redis_up[1h])", 1)
    prom.settles("max_over_time(redis_exporter_last_scrape_error[1h])", 0)
    prom.settles('redis_commands_failed_calls_total{cmd="eval"}', 0)

    check_dashboard(prom, module=False)
