"""Calendar quotas and reservations against real servers (docs/commands.md,
Calendar quotas and Reservations): Quota's checks, a quota charged,
peeked and settled on every backend, a quota and a bucket in one
all-or-nothing decision, a lease beside a quota, the in-process fallback, the RateLimit fields of
a quota, and a fleet of `wait` callers paced at the bucket's rate."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import redis
from conftest import Pool, Target, make_target, run

import redis_tokenbucket.asyncio as tb_asyncio
from redis_tokenbucket import Bucket, Concurrency, InvalidArgument, Limiter, Quota, rate_limit_headers

# One server per backend: the module, the Functions library, the EVAL script.
BACKENDS = ["redis-7.0+module", "redis-7.0", "redis-6.2"]


@pytest.fixture(params=BACKENDS)
def backend_target(request: pytest.FixtureRequest, pool: Pool) -> Target:
    return make_target(pool, request.param)


@pytest.mark.parametrize(
    ("kwargs", "field", "text"),
    [
        ({"limit": 0, "period": "day"}, "limit", "limit must be > 0 and <= 1e12"),
        ({"limit": 10, "period": "fortnight"}, "period", "period must be DAY, WEEK, MONTH, YEAR or whole seconds"),
        ({"limit": 10, "period": 0}, "period", "period must be DAY"),
        ({"limit": 10, "period": True}, "period", "period must be DAY"),
        ({"limit": 10, "period": "day", "offset": 1440}, "offset", "offset must be >= -1439 and <= 1439"),
        ({"limit": 10, "period": "day", "offset": 1.5}, "offset", "offset must be an integer"),
    ],
)
def test_a_quota_is_checked_when_built(kwargs: dict[str, object], field: str, text: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        Quota(**kwargs)  # type: ignore[arg-type]
    assert caught.value.field == field
    assert str(caught.value).startswith(text)


def test_a_quota_spells_its_period_as_sent() -> None:
    assert Quota(10, "Month")._limit_args == ("10.0", "MONTH")
    assert Quota(10, 3600, offset=-300)._after_args == ("OFFSET", "-300")
    assert Quota(10, "day").label == "day" and Quota(10, 60).label == "60s"
    # A month's own length: February 2028 (a leap year) ends on 1 March.
    march = 1835481600  # 2028-03-01T00:00:00Z
    assert Quota(1, "month").period_seconds(march) == 29 * 86400
    assert Quota(1, "year").period_seconds(march) == 366 * 86400
    # At UTC+10 the local month that ends at 14:00Z of the last day is that month.
    assert Quota(1, "month", offset=600).period_seconds(march - 600 * 60) == 29 * 86400


def test_a_quota_is_charged_peeked_and_settled_on_every_backend(backend_target: Target) -> None:
    lim = Limiter(backend_target.client(), backend=backend_target.backend)  # type: ignore[arg-type]
    q = Quota(5, "day", name="daily")
    first = lim.consume("rl:q", q, 4)
    assert (first.allowed, first.remaining, first.retry_after_ms) == (True, 1, 0)
    # Until the next UTC midnight, and no longer.
    assert 0 < first.reset_after_ms <= 86_400_000
    denied = lim.consume("rl:q", q, 2)
    assert not denied.allowed and denied.remaining == 1
    assert denied.retry_after_ms == pytest.approx(first.reset_after_ms, abs=1000)
    assert lim.peek("rl:q", q, 1).allowed
    refunded = lim.adjust("rl:q", q, 3)
    assert (refunded.allowed, refunded.remaining) == (True, 4)
    # A quota's key is no bucket: the server says so, nothing is reset.
    with pytest.raises(redis.ResponseError, match="not a token bucket"):
        lim.consume("rl:q", Bucket(5, 1))
    assert lim.peek("rl:q", q, 0).remaining == 4


def test_a_quota_and_a_bucket_are_charged_all_or_nothing(backend_target: Target) -> None:
    lim = Limiter(backend_target.client(), backend=backend_target.backend)  # type: ignore[arg-type]
    month, minute = Quota(10, "month"), Bucket(3, 0.05)
    both = lim.consume_many([("rl:m", month, 3), ("rl:r", minute, 3)])
    assert both.allowed and [d.remaining for d in both.decisions] == [7, 0]
    # The bucket is empty: the quota is not charged either.
    denied = lim.consume_many([("rl:m", month, 1), ("rl:r", minute, 1)])
    assert not denied.allowed and denied.denied_by[0].key == "rl:r"
    assert lim.peek("rl:m", month, 0).remaining == 7
    # With a wait, the bucket's tokens are reserved: admitted, with its delay.
    reserved = lim.consume_many([("rl:m", month, 1), ("rl:r", minute, 1)], max_wait=60)
    assert reserved.allowed and 0 < reserved.delay_ms <= 20_000
    assert lim.peek("rl:m", month, 0).remaining == 6


def test_a_lease_and_a_monthly_quota_are_taken_all_or_nothing(backend_target: Target) -> None:
    lim = Limiter(backend_target.client(), backend=backend_target.backend)  # type: ignore[arg-type]
    streams, month, minute = Concurrency(2, 30_000), Quota(10, "month", offset=60), Bucket(5, 0.1)
    rules = [("rl:{u}:month", month, 6), ("rl:{u}:minute", minute, 1)]
    first = lim.acquire("rl:{u}:streams", streams, buckets=rules)
    assert first.acquired and [d.remaining for d in first.decisions] == [4, 4]
    assert first.decisions[0].bucket == month
    # The quota can't pay: no slot taken, the bucket not charged.
    denied = lim.acquire("rl:{u}:streams", streams, buckets=rules)
    assert not denied.acquired and denied.in_use == 1
    assert denied.retry_after_ms == denied.decisions[0].retry_after_ms > 0
    assert lim.peek("rl:{u}:minute", minute, 0).remaining == 4
    # A retry of the lease taken charges nothing again.
    again = lim.acquire("rl:{u}:streams", streams, buckets=rules, id=first.id)
    assert again.acquired and again.in_use == 1
    assert lim.peek("rl:{u}:month", month, 0).remaining == 4
    with pytest.raises(redis.ResponseError, match="not a quota"):
        lim.acquire("rl:{u}:streams", streams, buckets=[("rl:{u}:minute", month, 1)])


def test_a_reservation_admits_in_debt_and_says_how_long_to_wait(backend_target: Target) -> None:
    lim = Limiter(backend_target.client(), backend=backend_target.backend)  # type: ignore[arg-type]
    b = Bucket(2, 1)
    assert lim.consume("rl:b", b, 2).delay_ms == 0
    reserved = lim.consume("rl:b", b, 1, max_wait=5)
    assert reserved.allowed and reserved.remaining == -1
    assert 900 <= reserved.delay_ms <= 1000
    # Past the wait allowed: a plain denial, nothing written.
    denied = lim.consume("rl:b", b, 2, max_wait=0.5)
    assert not denied.allowed and denied.delay_ms == 0
    assert lim.peek("rl:b", b, 0).remaining == -1
    with pytest.raises(InvalidArgument, match="a quota never reserves"):
        lim.consume("rl:q", Quota(1, "day"), max_wait=1)


def test_a_quota_answers_from_the_process_when_redis_fails() -> None:
    pytest.importorskip("lupa")
    # Nothing listens on this port: every call is a Redis failure.
    client = redis.Redis(port=1, socket_connect_timeout=0.05)
    lim = Limiter(client, backend="module", on_error="local", breaker=False, processes=2)
    q = Quota(4, "week")
    answers = [lim.consume("rl:q", q) for _ in range(3)]
    # This process's share of 4 is 2.
    assert [d.allowed for d in answers] == [True, True, False]
    assert all(d.degraded for d in answers)


def test_the_ratelimit_fields_of_a_quota_name_its_period(module_target: Target) -> None:
    lim = Limiter(module_target.client())
    d = lim.consume("rl:q", Quota(1000, 3600), 10)
    fields = rate_limit_headers(d)
    assert fields["RateLimit-Policy"] == '"3600s";q=1000;w=3600'
    t = -(-d.reset_after_ms // 1000)
    assert fields["RateLimit"] == f'"3600s";r=990;t={t}'
    d = lim.consume("rl:d", Quota(5, "day", name="daily"))
    assert rate_limit_headers(d)["RateLimit-Policy"] == '"daily";q=5;w=86400'


# A fleet paced by waits: 20 callers on a drained bucket of burst 20
# refilled at 20 per second. Each is admitted at once, in debt, and told
# to proceed a twentieth of a second after the one before: the last about
# a second after the first, none denied (the debt floor, -max, holds 20).
FLEET = 20
PACED = Bucket(FLEET, 20)


def check_paced(calls: list[tuple[float, int, float]]) -> None:
    """Each call as (sent at, delay_ms, returned at), on the monotonic
    clock: the times the callers were told to proceed are one token apart
    (within one token), and each slept until then."""
    assert len(calls) == FLEET
    proceed = sorted(sent + delay / 1000 for sent, delay, _ in calls)
    for k, at in enumerate(proceed):
        assert abs(at - proceed[0] - k / 20) <= 1 / 20, [round(p - proceed[0], 3) for p in proceed]
    for sent, delay, returned in calls:
        assert returned >= sent + delay / 1000


def test_a_fleet_of_waiting_threads_is_paced_at_the_rate(backend_target: Target) -> None:
    lim = Limiter(backend_target.client(), backend=backend_target.backend, timeout=2)  # type: ignore[arg-type]
    assert lim.consume("rl:fleet", PACED, FLEET).allowed
    out: list[tuple[float, int, float]] = []
    denied: list[object] = []
    lock = threading.Lock()

    def worker() -> None:
        sent = time.monotonic()
        d = lim.wait("rl:fleet", PACED, max_wait=5)
        with lock:
            out.append((sent, d.delay_ms, time.monotonic()))
            if not d.allowed:
                denied.append(d)

    threads = [threading.Thread(target=worker) for _ in range(FLEET)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert denied == []
    check_paced(out)


def test_a_fleet_of_waiting_tasks_is_paced_at_the_rate(module_target: Target) -> None:
    async def body() -> list[tuple[float, int, float]]:
        async with tb_asyncio.Limiter(module_target.async_client(), timeout=2) as lim:
            assert (await lim.consume("rl:fleet", PACED, FLEET)).allowed

            async def one() -> tuple[float, int, float]:
                sent = time.monotonic()
                d = await lim.wait("rl:fleet", PACED, max_wait=5)
                assert d.allowed
                return sent, d.delay_ms, time.monotonic()

            return list(await asyncio.gather(*(one() for _ in range(FLEET))))

    check_paced(run(body()))
