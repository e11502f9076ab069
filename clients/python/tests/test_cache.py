"""The local denial cache: known denials answered without a round trip,
until their retry time, bounded, on a monotonic clock."""

from __future__ import annotations

import pytest
import redis
from conftest import Target, calls, run

import redis_tokenbucket.asyncio as tb_asyncio
from redis_tokenbucket import Bucket, DenialCache, Limiter

# 2 tokens, one back every 10 s: a denial means "retry in up to 10 s".
B = Bucket(2, 0.1, name="user")
TB = ("tb.consume", "tb.peek", "tb.mconsume", "tb.adjust")


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def cached_limiter(target: Target, clock: FakeClock, size: int = 100) -> Limiter:
    return Limiter(target.client(), denial_cache=DenialCache(size, clock=clock))


def round_trips(target: Target) -> int:
    with target.admin() as admin:
        return calls(admin, *TB)


def test_off_by_default(module_target: Target):
    lim = Limiter(module_target.client())
    assert lim.denial_cache is None
    results = [lim.consume("rl:hot", B).allowed for _ in range(10)]
    assert results == [True, True] + [False] * 8
    assert round_trips(module_target) == 10


def test_a_hot_denied_key_costs_one_round_trip_per_retry_window(module_target: Target, clock: FakeClock):
    lim = cached_limiter(module_target, clock)
    assert [lim.consume("rl:hot", B).allowed for _ in range(2)] == [True, True]
    first = lim.consume("rl:hot", B)
    assert not first.allowed and not first.cached
    assert round_trips(module_target) == 3
    for _ in range(50):
        d = lim.consume("rl:hot", B)
        assert not d.allowed and d.cached and d.retry_after_ms == first.retry_after_ms
    assert round_trips(module_target) == 3
    assert lim.denial_cache is not None and lim.denial_cache.hits == 50
    # Time passes on the local clock: the retry time shrinks with it.
    clock.now += 4
    d = lim.consume("rl:hot", B)
    assert d.cached and d.retry_after_ms == first.retry_after_ms - 4000
    # A peek for the same cost is answered from memory too.
    assert lim.peek("rl:hot", B).cached
    # Past the retry time, Redis is asked again.
    clock.now += first.retry_after_ms / 1000
    assert not lim.consume("rl:hot", B).cached
    assert round_trips(module_target) == 4


def test_what_might_pass_goes_to_redis(module_target: Target, clock: FakeClock):
    lim = cached_limiter(module_target, clock)
    lim.consume("rl:k", B, 1.5)
    assert not lim.consume("rl:k", B, 1).allowed  # 0.5 left
    assert lim.consume("rl:k", B, 1).cached
    assert lim.consume("rl:k", B, 2).cached  # costlier: denied as well
    # Cheaper, or another bucket size: maybe not denied, so not cached.
    assert lim.consume("rl:k", B, 0.25).allowed
    assert not lim.consume("rl:k", Bucket(20, 0.1), 1).cached
    # A refund from this process forgets the key.
    lim.adjust("rl:k", B, 2)
    assert lim.consume("rl:k", B, 1).allowed


def test_consume_many_denials_are_cached(module_target: Target, clock: FakeClock):
    lim = cached_limiter(module_target, clock)
    groups = [("rl:{u}:a", B, 2), ("rl:{u}:b", B, 1)]
    assert lim.consume_many(groups).allowed
    first = lim.consume_many(groups)
    assert not first.allowed and not first.cached
    again = lim.consume_many(groups)
    assert again.cached and not again.allowed and again.retry_after_ms == first.retry_after_ms
    assert [d.allowed for d in again.decisions] == [False, True]
    assert round_trips(module_target) == 2
    lim.adjust("rl:{u}:b", B, 1)  # touches one of the keys: the entry goes
    assert not lim.consume_many(groups).cached


def test_the_cache_is_bounded(module_target: Target, clock: FakeClock):
    lim = cached_limiter(module_target, clock, size=2)
    for key in ("rl:1", "rl:2", "rl:3"):
        lim.consume(key, B, 2)
        lim.consume(key, B, 2)  # denied and cached
    cache = lim.denial_cache
    assert cache is not None and len(cache) == 2
    assert lim.consume("rl:3", B, 2).cached and lim.consume("rl:2", B, 2).cached
    assert not lim.consume("rl:1", B, 2).cached  # the least recently used went
    with pytest.raises(ValueError):
        DenialCache(0)


def test_asyncio_shares_the_cache_logic(module_target: Target, clock: FakeClock):
    async def main() -> list[tuple[bool, bool]]:
        client = module_target.async_client()
        try:
            lim = tb_asyncio.Limiter(client, denial_cache=DenialCache(10, clock=clock))
            return [((d := await lim.consume("rl:a", B)).allowed, d.cached) for _ in range(5)]
        finally:
            await client.aclose()

    assert run(main()) == [(True, False), (True, False), (False, False), (False, True), (False, True)]
    assert round_trips(module_target) == 3


def test_an_integer_turns_it_on():
    lim = Limiter(redis.Redis(), denial_cache=500)
    assert lim.denial_cache is not None and lim.denial_cache.max_entries == 500
