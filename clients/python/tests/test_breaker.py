"""The circuit breaker and the bounded fail-open (docs/failure-model.md):
Redis killed, back, frozen; on_error="local" under a dead Redis."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import redis
from conftest import SLOW, all_connections_busy, run
from tbservers import Server

import redis_tokenbucket.asyncio as tb_asyncio
from redis_tokenbucket import Breaker, Bucket, CircuitOpenError, DecisionEvent, Limiter

B = Bucket(10, SLOW, name="user")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def own_server(tmp_path: Path) -> Any:
    server = Server("redis-7.0", tmp_path / "own", module=True).start()
    yield server
    server.resume()
    server.stop()


def test_redis_killed_opens_the_breaker_and_back_closes_it(own_server: Server):
    clock = Clock()
    events: list[DecisionEvent] = []
    lim = Limiter(
        own_server.client(), on_error="open", breaker=Breaker(3, 10, 2, clock=clock), on_decision=events.append
    )
    assert not lim.consume("k", B).degraded
    own_server.stop()
    # Three failures within the window open it.
    for _ in range(3):
        assert lim.consume("k", B).degraded
    assert lim.breaker_state == "open"
    assert [e.breaker for e in events[1:]] == ["closed", "closed", "open"]
    # Redis is back, but the breaker is open: the policy answers without
    # touching the network (a try would have reached Redis and passed).
    own_server.restart()
    for _ in range(5):
        assert lim.consume("k", B).degraded
    with pytest.raises(CircuitOpenError):
        lim.consume("k", B, on_error="raise")
    # After the cooldown one call probes, finds Redis (a new one, empty)
    # and closes it.
    clock.now += 2
    d = lim.consume("k", B)
    assert d.allowed and not d.degraded and d.remaining == 9
    assert lim.breaker_state == "closed" and events[-1].breaker == "closed"


def test_a_failed_probe_opens_the_breaker_again(own_server: Server):
    clock = Clock()
    lim = Limiter(own_server.client(), on_error="closed", breaker=Breaker(1, 10, 2, clock=clock))
    own_server.stop()
    assert lim.consume("k", B).degraded
    assert lim.breaker_state == "open"
    clock.now += 2
    assert lim.consume("k", B).degraded  # the probe, refused
    assert lim.breaker_state == "open"
    clock.now += 1
    assert lim.consume("k", B).degraded and lim.breaker_state == "open"  # within the new cooldown


def test_redis_frozen_opens_the_breaker_once_the_budget_passes(own_server: Server):
    clock = Clock()

    async def main() -> list[Any]:
        client = redis.asyncio.Redis(port=own_server.port)
        lim = tb_asyncio.Limiter(client, timeout=0.1, on_error="closed", breaker=Breaker(2, 10, 2, clock=clock))
        out: list[Any] = [(await lim.consume("k", B)).degraded]
        own_server.pause()
        try:
            for _ in range(2):  # each pays the budget, then counts
                out.append((await lim.consume("k", B)).degraded)
            out.append(lim.breaker_state)
            out.append((await lim.consume("k", B)).degraded)  # at once
        finally:
            own_server.resume()
        clock.now += 2
        d = await lim.consume("k", B)
        out += [d.degraded, d.remaining, lim.breaker_state]
        await lim.aclose()
        await client.aclose()
        return out

    # A frozen Redis still accepts connections (the kernel does), so both
    # timed-out commands were written, each on a connection closed since,
    # and Redis charged them when it woke: 10 - 4 tokens.
    assert run(main()) == [False, True, True, "open", True, False, 6, "closed"]


def test_shed_calls_and_usage_errors_never_open_it(own_server: Server):
    """A breaker that one Redis failure opens: usage errors (Redis
    answered) and shed calls (no connection free within the budget: the
    process is busy, Redis is not failing) leave it closed."""
    lim = Limiter(own_server.client(max_connections=1), on_error="open", breaker=Breaker(1, 10, 2))
    with own_server.client() as admin:
        admin.set("rl:string", "x")
    for _ in range(3):
        with pytest.raises(redis.ResponseError):
            lim.consume("rl:string", B)
    assert lim.breaker_state == "closed"
    with all_connections_busy(lim):
        for _ in range(3):
            d = lim.consume("k", B, timeout=0.05)
            assert d.shed and not d.degraded and not d.allowed
    assert lim.breaker_state == "closed"
    own_server.stop()  # and one failure does open it
    assert lim.consume("k", B).degraded
    assert lim.breaker_state == "open"


@pytest.mark.parametrize("flavour", ["sync", "asyncio"])
def test_local_fallback_admits_about_a_processes_share_of_each_key(flavour: str, own_server: Server):
    own_server.stop()
    bucket = Bucket(10, SLOW, name="user")

    def count(decisions: list[Any]) -> int:
        assert all(d.degraded for d in decisions)
        return sum(d.allowed for d in decisions)

    if flavour == "sync":
        lim = Limiter(own_server.client(), on_error="local", processes=2)
        a = [lim.consume("rl:a", bucket) for _ in range(20)]
        b = [lim.consume_many([("rl:b", bucket), ("rl:c", Bucket(100, SLOW))]) for _ in range(20)]
    else:

        async def main() -> tuple[list[Any], list[Any]]:
            alim = tb_asyncio.Limiter(redis.asyncio.Redis(port=own_server.port), on_error="local", processes=2)
            a = [await alim.consume("rl:a", bucket) for _ in range(20)]
            b = [await alim.consume_many([("rl:b", bucket), ("rl:c", Bucket(100, SLOW))]) for _ in range(20)]
            return a, b

        a, b = run(main())
    # 10 / 2 processes = 5 per key; the refusals say when to retry.
    assert count(a) == 5 and count(b) == 5
    assert a[5].retry_after_ms > 0 and b[5].retry_after_ms > 0
    assert a[4].remaining == 0


def test_plain_open_is_unlimited_while_redis_is_down(own_server: Server):
    own_server.stop()
    lim = Limiter(own_server.client(), on_error="open")
    assert all(lim.consume("rl:a", B).allowed for _ in range(50))


def test_breaker_settings_are_checked():
    with pytest.raises(ValueError, match="failures"):
        Breaker(0)
    with pytest.raises(ValueError, match="cooldown"):
        Breaker(cooldown=0)
    with pytest.raises(ValueError, match="processes"):
        Limiter(redis.Redis(), processes=0)
    with pytest.raises(TypeError, match="breaker"):
        Limiter(redis.Redis(), breaker="yes")  # type: ignore[arg-type]
    assert Limiter(redis.Redis(), breaker=False).breaker is None
