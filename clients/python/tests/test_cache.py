"""The local denial cache: known denials answered without a round trip,
until their retry time, bounded, on a monotonic clock."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis
import redis.asyncio
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


def test_one_key_however_it_is_spelled(module_target: Target, clock: FakeClock):
    lim = cached_limiter(module_target, clock)
    lim.consume("7", B, 2)
    assert not lim.consume("7", B).cached
    for spelling in (7, "7", b"7", bytearray(b"7"), memoryview(b"7")):
        d = lim.consume(spelling, B)
        assert d.cached and d.key == "7", spelling
    lim.adjust(b"7", B, 2)  # a refund under another spelling forgets it too
    assert lim.consume(7, B).allowed
    assert round_trips(module_target) == 4


def test_the_option_true_is_a_cache_of_the_default_size():
    for on in (True, 10_000):
        cache = Limiter(redis.Redis(), denial_cache=on).denial_cache
        assert cache is not None and cache.max_entries == 10_000
    for off in (None, False, 0):
        assert Limiter(redis.Redis(), denial_cache=off).denial_cache is None
    with pytest.raises(TypeError, match="denial_cache must be"):
        Limiter(redis.Redis(), denial_cache="big")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_entries must be >= 1"):
        Limiter(redis.Redis(), denial_cache=-1)
    with pytest.raises(TypeError, match="max_entries must be an int"):
        DenialCache(True)


def test_a_shared_cache_needs_one_key_encoding():
    shared = DenialCache(10)
    a = Limiter(redis.Redis(), denial_cache=shared)
    b = Limiter(redis.Redis(), denial_cache=shared)
    assert a.denial_cache is b.denial_cache is shared and shared.encoding == "utf-8"
    with pytest.raises(ValueError, match="encoded as utf-8, the client encodes them as latin-1"):
        Limiter(redis.Redis(encoding="latin-1"), denial_cache=shared)


class SlowReplies(redis.Redis):
    """Every reply arrives `delay` seconds of the fake clock after its request."""

    def __init__(self, clock: FakeClock, delay: float, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.clock, self.delay = clock, delay

    def execute_command(self, *args: Any, **options: Any) -> Any:
        reply = super().execute_command(*args, **options)
        self.clock.now += self.delay
        return reply


def test_the_deadline_counts_from_when_the_request_was_sent(module_target: Target, clock: FakeClock):
    """Had the clock been read when the reply came, the cache would deny
    for 5 s longer than Redis does."""
    client = SlowReplies(clock, 5.0, port=module_target.server.port)
    lim = Limiter(client, denial_cache=DenialCache(10, clock=clock))
    lim.consume("rl:slow", B, 2)
    sent = clock.now
    first = lim.consume("rl:slow", B)
    assert not first.allowed and clock.now == sent + 5
    deadline = sent + first.retry_after_ms / 1000
    clock.now = deadline - 0.001
    cached = lim.consume("rl:slow", B)
    assert cached.cached and cached.retry_after_ms == 1
    clock.now = deadline
    assert not lim.consume("rl:slow", B).cached


class Gated(redis.asyncio.Redis):
    """Holds the reply of the next command named `hold` until `release` is set."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.hold = ""
        self.reached, self.release = asyncio.Event(), asyncio.Event()

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        reply = await super().execute_command(*args, **options)
        if args[0] == self.hold:
            self.hold = ""
            self.reached.set()
            await self.release.wait()
        return reply


def test_a_denial_overtaken_by_a_refund_is_not_remembered(module_target: Target, clock: FakeClock):
    """Redis denies a consume; before its reply is read, a refund from this
    limiter lands. The denial predates the refund, so the cache must not
    keep it: the next consume goes to Redis, and passes."""

    async def main() -> tuple[bool, bool, bool]:
        client = Gated(port=module_target.server.port)
        try:
            lim = tb_asyncio.Limiter(client, denial_cache=DenialCache(10, clock=clock))
            await lim.consume("rl:race", B, 2)
            client.hold = "TB.CONSUME"
            pending = asyncio.ensure_future(lim.consume("rl:race", B))
            await client.reached.wait()  # denied by Redis, the reply not yet read
            await lim.adjust("rl:race", B, 2)
            client.release.set()
            denied = await pending
            after = await lim.consume("rl:race", B)
            return denied.allowed, after.allowed, after.cached
        finally:
            await client.aclose()

    assert run(main()) == (False, True, False)


def test_every_write_of_this_limiter_drops_the_entries_of_its_key(module_target: Target, clock: FakeClock):
    lim = cached_limiter(module_target, clock)
    empty = Bucket(1, 0.1)
    lim.consume("rl:w", B, 1.5)  # 0.5 left
    assert not lim.consume("rl:w", B).allowed
    assert lim.consume("rl:w", B).cached
    # A cheaper request passes, and charges the key.
    assert lim.consume("rl:w", B, 0.25).allowed
    assert not lim.consume("rl:w", B).cached
    assert lim.consume("rl:w", B).cached
    # Bucket by bucket, the key is charged, then refunded when the next denies.
    lim.consume("rl:e", empty)
    m = lim.consume_many([("rl:w", B, 0.25), ("rl:e", empty, 1)], atomic=False)
    assert not m.allowed and not m.atomic
    assert not lim.consume("rl:w", B).cached


class LostReplies(redis.Redis):
    """Runs TB.ADJUST, then loses its reply."""

    def execute_command(self, *args: Any, **options: Any) -> Any:
        reply = super().execute_command(*args, **options)
        if args[0] == "TB.ADJUST":
            raise redis.ConnectionError("the reply was lost")
        return reply


def test_a_write_whose_reply_is_lost_drops_the_entries_too(module_target: Target, clock: FakeClock):
    lim = Limiter(LostReplies(port=module_target.server.port), denial_cache=DenialCache(10, clock=clock))
    lim.consume("rl:lost", B, 2)
    lim.consume("rl:lost", B)
    assert lim.consume("rl:lost", B).cached
    with pytest.raises(redis.ConnectionError):
        lim.adjust("rl:lost", B, 2)  # it did refund
    d = lim.consume("rl:lost", B)
    assert d.allowed and not d.cached


def test_reset_drops_the_entry(module_target: Target, clock: FakeClock):
    lim = cached_limiter(module_target, clock)
    lim.consume("rl:reset", B, 2)
    lim.consume("rl:reset", B)
    assert lim.consume("rl:reset", B).cached
    assert lim.reset(b"rl:reset")
    d = lim.consume("rl:reset", B)
    assert d.allowed and not d.cached
