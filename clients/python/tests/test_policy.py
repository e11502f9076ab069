"""Failure policy: timeout and on_error, per limiter and per call. A
degraded answer is marked and logged, never silent."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import redis
import redis.asyncio
from conftest import SLOW, Target, run
from tbservers import Server, free_port

import redis_tokenbucket.asyncio as tb_asyncio
from redis_tokenbucket import Bucket, InvalidArgument, Limiter, MultiDecision

B = Bucket(5, SLOW, name="user")
GROUPS = [("rl:u", B, 1), ("rl:ip", B, 1)]


def dead_port() -> int:
    return free_port()  # nothing listens there


@pytest.mark.parametrize("policy, allowed", [("open", True), ("closed", False)])
def test_redis_down_answers_by_policy(policy: Any, allowed: bool, caplog: pytest.LogCaptureFixture):
    lim = Limiter(redis.Redis(port=dead_port()), on_error=policy)
    caplog.set_level(logging.ERROR, "redis_tokenbucket")
    d = lim.consume("rl:u", B)
    assert (d.allowed, d.degraded, d.remaining, d.retry_after_ms) == (allowed, True, 0, 0)
    assert (d.key, d.bucket, d.cost) == ("rl:u", B, 1)
    [record] = caplog.records
    assert f"fail-{policy}" in record.getMessage() and "ConnectionError" in record.getMessage()
    m = lim.consume_many(GROUPS)
    assert isinstance(m, MultiDecision) and (m.allowed, m.degraded) == (allowed, True)
    assert [(x.allowed, x.degraded) for x in m.decisions] == [(allowed, True)] * 2
    assert lim.backend is None  # nothing was found


def test_default_is_to_raise_and_calls_can_override():
    lim = Limiter(redis.Redis(port=dead_port()))
    with pytest.raises(redis.ConnectionError):
        lim.consume("rl:u", B)
    assert lim.consume("rl:u", B, on_error="open").allowed
    assert not Limiter(redis.Redis(port=dead_port()), on_error="open").peek("k", B, on_error="closed").allowed
    with pytest.raises(redis.ConnectionError):
        Limiter(redis.Redis(port=dead_port()), on_error="open").adjust("k", B, 1, on_error="raise")


def test_bad_arguments_are_never_swallowed():
    lim = Limiter(redis.Redis(port=dead_port()), on_error="open")
    with pytest.raises(InvalidArgument):
        lim.consume("k", B, 6)
    with pytest.raises(ValueError, match="on_error must be one of"):
        lim.consume("k", B, on_error="maybe")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timeout must be > 0"):
        Limiter(redis.Redis(), timeout=0)


def test_usage_errors_from_the_server_always_raise(module_target: Target):
    with module_target.admin() as admin:
        admin.set("rl:string", "x")
    lim = Limiter(module_target.client())
    for policy in ("raise", "open", "closed", "local"):
        with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
            lim.consume("rl:string", B, on_error=policy)  # type: ignore[arg-type]


def test_a_hung_server_times_out_sync(own_server: Server, caplog: pytest.LogCaptureFixture):
    client = own_server.client()
    lim = Limiter(client, timeout=0.2, on_error="open")
    assert not lim.consume("k", B).degraded
    own_server.pause()
    try:
        d = lim.consume("k", B)
        assert d.allowed and d.degraded
        assert "TimeoutError" in caplog.text
        assert not lim.consume("k", B, on_error="closed").allowed
        with pytest.raises(redis.TimeoutError):
            lim.consume("k", B, on_error="raise")
    finally:
        own_server.resume()
    # The abandoned calls finish on their own; the limiter carries on.
    assert not Limiter(own_server.client()).peek("k", B).degraded
    client.close()


def test_a_hung_server_times_out_asyncio(own_server: Server):
    async def main() -> list[tuple[bool, bool]]:
        client = redis.asyncio.Redis(port=own_server.port)
        lim = tb_asyncio.Limiter(client, timeout=0.2, on_error="closed")
        out = []
        try:
            d = await lim.consume("k", B)
            out.append((d.allowed, d.degraded))
            own_server.pause()
            try:
                d = await lim.consume("k", B)
                out.append((d.allowed, d.degraded))
                m = await lim.consume_many(GROUPS, on_error="open")
                out.append((m.allowed, m.degraded))
            finally:
                own_server.resume()
            # The cancelled command's connection was dropped, not reused.
            d = await lim.consume("k", B, timeout=5)
            out.append((d.allowed, d.degraded))
        finally:
            await client.aclose()
        return out

    assert run(main()) == [(True, False), (False, True), (True, True), (True, False)]


def test_repeated_failures_are_counted_not_flooded(caplog: pytest.LogCaptureFixture):
    caplog.set_level(logging.ERROR, "redis_tokenbucket")
    # A client with redis-py's default retries (redis-py 8 backs off for
    # seconds on a refused connection): the limiter never retries on its
    # own connections, so the five refused calls come within the second.
    lim = Limiter(redis.Redis(port=dead_port()), on_error="open")
    for _ in range(5):
        assert lim.consume("k", B).degraded
    # One line now; the next line, a second or more later, counts the rest.
    assert len(caplog.records) == 1
    lim._policy.errors._last["open"] -= 2  # as if a second had passed
    lim.consume("k", B)
    assert len(caplog.records) == 2 and "4 more degraded answers" in caplog.records[1].getMessage()
    # Each policy has its own budget: a fail-closed answer is reported at once.
    lim.consume("k", B, on_error="closed")
    assert len(caplog.records) == 3 and "fail-closed" in caplog.records[2].getMessage()


@pytest.mark.parametrize("ratio", [0, -0.5, 1.5, "0.8", True, float("nan")])
def test_a_near_limit_ratio_outside_0_to_1_is_refused_naming_it(ratio: Any):
    with pytest.raises(ValueError, match=r"near_limit_ratio must be a number in \(0, 1\], got"):
        Limiter(redis.Redis(port=dead_port()), near_limit_ratio=ratio)


def test_shadow_is_true_or_false():
    with pytest.raises(TypeError, match="shadow must be True or False, got 'yes'"):
        Limiter(redis.Redis(port=dead_port()), shadow="yes")  # type: ignore[arg-type]
