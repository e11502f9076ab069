"""Concurrency leases (docs/commands.md, Concurrency leases): Concurrency's
checks, acquire/renew/release/in_flight on every backend, exact admission
under 50 concurrent clients, expiry, `hold` and `keep` (renewed in the
background, released on every exit, a SIGKILLed holder freed by expiry),
Cluster, and the failure policy for acquire."""

from __future__ import annotations

import asyncio
import logging
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.cluster
from conftest import SLOW, Pool, Target, calls, clean, make_target, run
from tbservers import Cluster, Server, free_port

import redis_tokenbucket.asyncio as tb_asyncio
from redis_tokenbucket import (
    Breaker,
    Bucket,
    Busy,
    Concurrency,
    CrossSlotError,
    DecisionEvent,
    InvalidArgument,
    Lease,
    Limiter,
    hash_tagged,
)
from redis_tokenbucket._contract import MAX_LEASE_ID_BYTES, MAX_LEASE_LIMIT, MAX_LEASE_MS

STREAMS = Concurrency(2, 60_000, name="streams")
USER = Bucket(3, SLOW, name="user")

# One server per backend: the module, the Functions library, the EVAL script.
BACKENDS = ["redis-7.0+module", "redis-7.0", "redis-6.2"]


@pytest.fixture(params=BACKENDS)
def backend_target(request: pytest.FixtureRequest, pool: Pool) -> Target:
    return make_target(pool, request.param)


def until(check: Callable[[], Any], seconds: float, what: str) -> Any:
    """Polls `check` until it answers truthy; fails after `seconds` (a
    liveness bound, not a timing assertion)."""
    deadline = time.monotonic() + seconds
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not after {seconds} s")
        time.sleep(0.01)


# ---- Concurrency and the arguments: the module's rules and messages -----------------

BAD: list[tuple[str, Callable[[], Any], list[Any]]] = [
    ("limit", lambda: Concurrency(0, 1000), ["0", "1000"]),
    ("limit", lambda: Concurrency(MAX_LEASE_LIMIT + 1, 1000), [str(MAX_LEASE_LIMIT + 1), "1000"]),
    ("limit", lambda: Concurrency(2.5, 1000), ["2.5", "1000"]),  # type: ignore[arg-type]
    ("lease_ms", lambda: Concurrency(2, 0), ["2", "0"]),
    ("lease_ms", lambda: Concurrency(2, MAX_LEASE_MS + 1), ["2", str(MAX_LEASE_MS + 1)]),
    ("lease_ms", lambda: Concurrency(2, "1000"), ["2", "1e3"]),  # type: ignore[arg-type]
]


@pytest.mark.parametrize(("field", "build", "args"), BAD, ids=[f"{f}-{a[0]}-{a[1]}" for f, _, a in BAD])
def test_concurrency_is_checked_with_the_modules_messages(
    module_target: Target, field: str, build: Callable[[], Any], args: list[Any]
):
    with pytest.raises(InvalidArgument) as raised:
        build()
    assert raised.value.field == field
    with module_target.admin() as admin, pytest.raises(redis.ResponseError) as reply:
        admin.execute_command("TB.ACQUIRE", "rl:k", *args, "id")
    assert str(raised.value) == str(reply.value)


def test_call_arguments_are_checked_before_anything_is_sent(module_target: Target):
    lim = Limiter(module_target.client())
    admin = module_target.admin()
    bad_calls: list[tuple[str, Callable[[], Any], list[Any]]] = [
        ("weight", lambda: lim.acquire("rl:k", STREAMS, 0), ["2", "1000", "id", "0"]),
        ("weight", lambda: lim.acquire("rl:k", STREAMS, 3), ["2", "1000", "id", "3"]),
        ("weight", lambda: lim.acquire("rl:k", STREAMS, 1.5), ["2", "1000", "id", "1.5"]),
        ("id", lambda: lim.acquire("rl:k", STREAMS, id=""), ["2", "1000", ""]),
        ("id", lambda: lim.acquire("rl:k", STREAMS, id="x" * (MAX_LEASE_ID_BYTES + 1)), ["2", "1000", "x" * 257]),
        (
            "buckets",
            lambda: lim.acquire("rl:k", STREAMS, buckets=[("rl:u", USER, 1), ("rl:k", USER, 1)]),
            ["2", "1000", "id", "BUCKET", "rl:u", "3", "0.001", "1", "BUCKET", "rl:k", "3", "0.001", "1"],
        ),
        (
            "key",
            lambda: lim.acquire("rl:k", STREAMS, buckets=[("rl:u", USER, 1), ("rl:u", USER, 1)]),
            ["2", "1000", "id", "BUCKET", "rl:u", "3", "0.001", "1", "BUCKET", "rl:u", "3", "0.001", "1"],
        ),
        (
            "cost",
            lambda: lim.acquire("rl:k", STREAMS, buckets=[("rl:u", USER, 4)]),
            ["2", "1000", "id", "BUCKET", "rl:u", "3", "0.001", "4"],
        ),
    ]
    for field, call, args in bad_calls:
        with pytest.raises(InvalidArgument) as raised:
            call()
        assert raised.value.field == field
        with pytest.raises(redis.ResponseError) as reply:
            admin.execute_command("TB.ACQUIRE", "rl:k", *args)
        assert str(raised.value) == str(reply.value), field
    with pytest.raises(TypeError, match="Concurrency"):
        lim.acquire("rl:k", USER)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="Lease"):
        lim.release("rl:k")  # type: ignore[arg-type]
    # Only the test's own commands reached the server.
    assert calls(admin, "tb.acquire") == len(bad_calls)
    assert admin.keys("*") == []


# ---- the calls, on every backend ------------------------------------------------------


def test_acquire_renew_release_in_flight(target: Target):
    lim = Limiter(target.client())
    first = lim.acquire("rl:streams:a", STREAMS, buckets=[("rl:user:a", USER, 1)], id="one")
    assert (first.acquired, first.in_use, first.retry_after_ms, first.id, first.key) == (
        True, 1, 0, "one", "rl:streams:a",
    )  # fmt: skip
    assert first.expires_in_ms == 60_000 and not (first.degraded or first.shed or first.lost)
    assert [(d.allowed, d.remaining, d.key) for d in first.decisions] == [(True, 2, "rl:user:a")]
    # A retry of the same id renews and counts once.
    assert lim.acquire("rl:streams:a", STREAMS, id="one").in_use == 1
    second = lim.acquire("rl:streams:a", STREAMS)
    assert second.acquired and second.in_use == 2 and len(str(second.id)) == 36  # a UUID
    # Full: denied, with the wait until a lease expires; nothing written.
    with target.admin() as admin:
        before = admin.hgetall("rl:streams:a")
    third = lim.acquire("rl:streams:a", STREAMS, buckets=[("rl:user:a", USER, 1)])
    assert not third.acquired and third.busy and third.in_use == 2 and third.expires_in_ms == 0
    assert 59_000 < third.retry_after_ms <= 60_000 and third.retry_after == 60
    assert [d.remaining for d in third.decisions] == [2]  # the bucket was not charged
    with target.admin() as admin:
        assert admin.hgetall("rl:streams:a") == before
    # A bucket that can't pay: no lease either.
    poor = lim.acquire("rl:streams:b", STREAMS, buckets=[("rl:user:a", USER, 3)])
    assert not poor.acquired and not poor.busy and poor.in_use == 0 and poor.denied_by == poor.decisions
    assert lim.in_flight("rl:streams:b") == 0
    # Renew, release (twice: harmless), renew after release.
    assert lim.in_flight("rl:streams:a") == 2
    assert lim.renew(first) and not first.lost
    assert lim.release(first) is True
    assert lim.release(first) is False
    assert lim.in_flight("rl:streams:a") == 1
    assert lim.renew(first) is False and first.lost
    assert lim.release(second) is True
    with target.admin() as admin:
        assert admin.exists("rl:streams:a") == 0  # the last release deletes the key
    # A weight takes that many slots.
    heavy = lim.acquire("rl:streams:a", STREAMS, 2)
    assert heavy.acquired and lim.in_flight("rl:streams:a") == 2
    assert lim.backend == target.backend


def test_the_asyncio_limiter_answers_the_same(target: Target):
    async def main() -> list[Any]:
        lim = tb_asyncio.Limiter(target.async_client())
        try:
            a = await lim.acquire("rl:streams:x", STREAMS, buckets=[("rl:user:x", USER, 2)])
            b = await lim.acquire("rl:streams:x", STREAMS, 1)
            c = await lim.acquire("rl:streams:x", STREAMS)
            return [
                (a.acquired, a.in_use, a.decisions[0].remaining),
                (b.acquired, b.in_use),
                (c.acquired, c.busy),
                await lim.in_flight("rl:streams:x"),
                await lim.renew(a),
                await lim.release(a),
                await lim.release(a),
                await lim.in_flight("rl:streams:x"),
            ]
        finally:
            await lim.aclose()

    assert run(main()) == [(True, 1, 1), (True, 2), (False, True), 2, True, True, False, 1]


def test_leases_held_counts_the_leases_this_limiter_holds(backend_target: Target):
    lim = Limiter(backend_target.client())
    other = Limiter(backend_target.client())
    three = Concurrency(3, 60_000, name="streams")
    assert lim.leases_held == 0
    a = lim.acquire("rl:streams:h", three, id="a")
    b = lim.acquire("rl:streams:h", three, id=b"b")
    assert (a.acquired, b.acquired, lim.leases_held) == (True, True, 2)
    # A retried acquire of a held id counts once, as str or bytes; the same
    # id on another key is another lease.
    assert lim.acquire("rl:streams:h", three, id=b"a").acquired and lim.leases_held == 2
    c = lim.acquire("rl:streams:h2", three, id="a")
    assert c.acquired and lim.leases_held == 3
    # Denied: not counted. A denied retry of a held id leaves it held (the
    # server keeps it), and releasing the denied answer gives nothing back.
    assert lim.acquire("rl:streams:h", three, 2).busy and lim.leases_held == 3
    denied_retry = lim.acquire("rl:streams:h", three, 3, id="a")
    assert not denied_retry.acquired and lim.leases_held == 3
    assert lim.release(denied_retry) is False and lim.renew(denied_retry) is False and lim.leases_held == 3
    # Another limiter's leases are its own.
    d = other.acquire("rl:streams:h", three)
    assert d.acquired and (lim.leases_held, other.leases_held) == (3, 1)
    # A renewal keeps it; a release gives it back (twice: harmless).
    assert lim.renew(a) and lim.leases_held == 3
    assert lim.release(b) is True and lim.leases_held == 2
    assert lim.release(b) is False and lim.leases_held == 2
    # Released by someone else: held until a renewal finds it lost.
    assert other.release(c) is True and (lim.leases_held, other.leases_held) == (2, 1)
    assert lim.renew(c) is False and c.lost and lim.leases_held == 1
    assert lim.in_flight("rl:streams:h") == 2  # a and other's d
    assert lim.release(a) and other.release(d) and (lim.leases_held, other.leases_held) == (0, 0)
    # hold: held while the block runs, given back however it ends.
    with lim.hold("rl:streams:h", three) as held:
        assert held.acquired and lim.leases_held == 1
    assert lim.leases_held == 0
    with pytest.raises(RuntimeError), lim.hold("rl:streams:h", three):
        raise RuntimeError("the stream failed")
    assert lim.leases_held == 0


def test_the_asyncio_limiter_counts_the_leases_it_holds(target: Target):
    async def main() -> list[Any]:
        lim = tb_asyncio.Limiter(target.async_client())
        one = Concurrency(1, 60_000)
        try:
            a = await lim.acquire("rl:streams:ah", one, id="a")
            counts = [lim.leases_held]
            await lim.acquire("rl:streams:ah", one, id="a")  # a retry
            await lim.acquire("rl:streams:ah", one)  # busy
            counts.append(lim.leases_held)
            await lim.release(a)
            counts.append(lim.leases_held)
            async with lim.hold("rl:streams:ah", one):
                counts.append(lim.leases_held)
            counts.append(lim.leases_held)
            return counts
        finally:
            await lim.aclose()

    assert run(main()) == [1, 1, 0, 1, 0]


def test_exactly_limit_of_fifty_concurrent_clients_get_a_slot(backend_target: Target):
    concurrency = Concurrency(8, 60_000, name="streams")
    lim = Limiter(backend_target.client())
    lim.in_flight("rl:streams:hot")  # the backend found (the library loaded) before the race
    start = threading.Barrier(50)
    leases: list[Lease] = []

    def client() -> None:
        start.wait()
        leases.append(lim.acquire("rl:streams:hot", concurrency, timeout=5))

    threads = [threading.Thread(target=client) for _ in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(leases) == 50 and not any(lease.degraded or lease.shed for lease in leases)
    assert sum(lease.acquired for lease in leases) == 8
    assert lim.in_flight("rl:streams:hot") == 8
    with backend_target.admin() as admin:
        assert admin.hlen("rl:streams:hot") == 8

    async def fifty_tasks() -> list[Lease]:
        alim = tb_asyncio.Limiter(backend_target.async_client())
        try:
            return list(await asyncio.gather(*(alim.acquire("rl:streams:hot2", concurrency) for _ in range(50))))
        finally:
            await alim.aclose()

    assert sum(lease.acquired for lease in run(fifty_tasks())) == 8
    assert lim.in_flight("rl:streams:hot2") == 8


def test_expiry_renew_after_expiry_and_release_idempotency(backend_target: Target):
    lim = Limiter(backend_target.client())
    short = Concurrency(1, 200, name="short")
    lease = lim.acquire("rl:streams:e", short)
    assert lease.acquired and not lim.acquire("rl:streams:e", short).acquired
    until(lambda: lim.in_flight("rl:streams:e") == 0, 10, "the lease expired")
    # Expired: never renewed, never recreated; releasing it is a no-op.
    assert lim.renew(lease) is False and lease.lost
    assert lim.in_flight("rl:streams:e") == 0
    assert lim.release(lease) is False
    # Its slot is free for another holder.
    other = lim.acquire("rl:streams:e", short)
    assert other.acquired
    assert lim.release(other) is True and lim.release(other) is False and lim.release(other) is False


# ---- hold and keep ---------------------------------------------------------------------


def test_hold_renews_in_the_background_and_releases(backend_target: Target):
    lim = Limiter(backend_target.client())
    quick = Concurrency(1, 300, name="quick")
    with lim.hold("rl:streams:h", quick) as lease:
        assert lease.acquired
        # Three leases' worth of time: only renewals keep it.
        time.sleep(1.0)
        assert lim.in_flight("rl:streams:h") == 1 and not lease.lost
        with pytest.raises(Busy) as busy, lim.hold("rl:streams:h", quick):
            pytest.fail("a second holder got the only slot")
        assert busy.value.lease.busy and busy.value.lease.in_use == 1
    assert lim.in_flight("rl:streams:h") == 0
    # An exception leaves the block: released too.
    with pytest.raises(ZeroDivisionError), lim.hold("rl:streams:h", quick):
        _ = 1 / 0
    assert lim.in_flight("rl:streams:h") == 0


def test_a_renewal_that_finds_the_lease_gone_sets_lost(module_target: Target, caplog: pytest.LogCaptureFixture):
    lim = Limiter(module_target.client())
    with lim.hold("rl:streams:l", Concurrency(1, 300)) as lease:
        with module_target.admin() as admin:
            admin.delete("rl:streams:l")
        until(lambda: lease.lost, 5, "a renewal noticed")
        # It was not taken again behind the holder's back.
        assert lim.in_flight("rl:streams:l") == 0
    assert "is lost" in caplog.text

    async def main() -> bool:
        alim = tb_asyncio.Limiter(module_target.async_client())
        async with alim.hold("rl:streams:l", Concurrency(1, 300)) as lease:
            with module_target.admin() as admin:
                admin.delete("rl:streams:l")
            for _ in range(500):
                if lease.lost:
                    break
                await asyncio.sleep(0.01)
        await alim.aclose()
        return lease.lost

    assert run(main())


def test_asyncio_hold_releases_on_cancellation(backend_target: Target):
    async def main() -> list[int]:
        lim = tb_asyncio.Limiter(backend_target.async_client())
        entered = asyncio.Event()

        async def stream() -> None:
            async with lim.hold("rl:streams:c", STREAMS):
                entered.set()
                await asyncio.sleep(3600)

        task = asyncio.ensure_future(stream())
        await entered.wait()
        during = await lim.in_flight("rl:streams:c")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        after = await lim.in_flight("rl:streams:c")
        # keep() of an acquired lease: the same upkeep.
        lease = await lim.acquire("rl:streams:c", STREAMS)
        async with lim.keep(lease):
            kept = await lim.in_flight("rl:streams:c")
        done = await lim.in_flight("rl:streams:c")
        await lim.aclose()
        return [during, after, kept, done]

    assert run(main()) == [1, 0, 1, 0]


def test_an_acquire_cancelled_in_flight_gives_its_slot_back(own_server: Server):
    """The cancelled caller never sees the lease, so nobody would release it:
    the acquire runs on, and the slot is given back when its answer comes."""
    admin = own_server.client()

    def counters() -> tuple[int, int]:
        info = admin.info("tb")
        return int(info["tb_acquired"]), int(info["tb_released"])

    async def main() -> None:
        lim = tb_asyncio.Limiter(redis.asyncio.Redis(port=own_server.port), timeout=10)
        await lim.in_flight("rl:streams:q")  # connected
        own_server.pause()
        task = asyncio.ensure_future(lim.hold("rl:streams:q", STREAMS).__aenter__())
        await asyncio.sleep(0.2)  # the command is written, the server frozen
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        own_server.resume()
        for _ in range(500):
            if counters() == (1, 1):
                break
            await asyncio.sleep(0.01)
        await lim.aclose()

    run(main())
    assert counters() == (1, 1)  # taken by the late answer, then given back
    assert admin.exists("rl:streams:q") == 0


def test_a_release_redis_cannot_take_is_logged_and_left_to_expiry(own_server: Server, caplog: pytest.LogCaptureFixture):
    lim = Limiter(own_server.client())
    kept = lim.acquire("rl:streams:d", STREAMS)
    with pytest.raises(KeyError), lim.hold("rl:streams:d", STREAMS):
        assert lim.leases_held == 2
        own_server.stop()
        raise KeyError("the block's own error goes up, not the release's")
    assert "could not be released" in caplog.text and "left to expire, within 60000 ms" in caplog.text
    # Given up all the same: no one holds it any more. A renewal that fails
    # is not a lost lease; a release that raises gives the lease up.
    assert lim.leases_held == 1
    with pytest.raises(redis.ConnectionError):
        lim.renew(kept)
    assert lim.leases_held == 1 and not kept.lost
    with pytest.raises(redis.ConnectionError):
        lim.release(kept)
    assert lim.leases_held == 0


HOLDER = textwrap.dedent("""
    import sys, time
    import redis
    from redis_tokenbucket import Concurrency, Limiter
    port, lease_ms = int(sys.argv[1]), int(sys.argv[2])
    lim = Limiter(redis.Redis(port=port))
    with lim.hold("rl:streams:killed", Concurrency(1, lease_ms, name="streams")) as lease:
        print(lease.id, flush=True)
        time.sleep(3600)
""")


def test_a_holder_killed_with_sigkill_frees_its_slot_within_lease_ms_and_a_second(backend_target: Target):
    lease_ms = 1000
    only = Concurrency(1, lease_ms, name="streams")
    lim = Limiter(backend_target.client())
    admin = backend_target.admin()
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(backend_target.server.port), str(lease_ms)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        lease_id = holder.stdout.readline().strip()
        assert lease_id, "the holder did not get its lease"
        # Alive, it keeps the slot past its lease_ms: its renewals do.
        time.sleep(2.5 * lease_ms / 1000)
        assert admin.hkeys("rl:streams:killed") == [lease_id]
        assert not lim.acquire("rl:streams:killed", only).acquired
    finally:
        holder.kill()  # SIGKILL: no release, no finally
        holder.wait()
    killed_at = time.monotonic()
    seconds, micros = admin.time()
    stored = admin.hget("rl:streams:killed", lease_id)
    # Server clock: the lease it left ends at most lease_ms from now...
    if stored is not None:
        expires_us = int(stored.split(":")[0])
        assert expires_us <= seconds * 1_000_000 + micros + lease_ms * 1000
    # ...and then another holder gets the slot.
    until(lambda: lim.acquire("rl:streams:killed", only).acquired, lease_ms / 1000 + 1, "the slot freed")
    assert time.monotonic() - killed_at <= lease_ms / 1000 + 1


# ---- Cluster ---------------------------------------------------------------------------


@pytest.mark.parametrize("module", [True, False], ids=["module", "functions"])
def test_cluster_leases_with_a_hash_tag(pool: Pool, module: bool):
    cluster: Cluster = pool.cluster(module)
    for node in cluster.nodes:
        clean(node)
    lim = Limiter(redis.cluster.RedisCluster(host="127.0.0.1", port=cluster.port))
    lease_key, user_key = hash_tagged("alice", "streams", "user")
    lease = lim.acquire(lease_key, STREAMS, buckets=[(user_key, USER, 1)])
    assert lease.acquired and lease.decisions[0].remaining == 2
    assert lim.in_flight(lease_key) == 1
    assert lim.renew(lease) and lim.release(lease) and lim.in_flight(lease_key) == 0
    # Keys in two slots: refused before anything is sent.
    sent = sum(calls(n.client(), "tb.acquire", "fcall") for n in cluster.nodes)
    with pytest.raises(CrossSlotError, match="one Cluster hash slot"):
        lim.acquire("rl:streams:bob", STREAMS, buckets=[("rl:user:bob", USER, 1)])
    assert sum(calls(n.client(), "tb.acquire", "fcall") for n in cluster.nodes) == sent
    # Many leases on many keys: each goes to its key's node.
    keys = [f"rl:streams:{i}" for i in range(20)]
    assert all(lim.acquire(k, STREAMS).acquired for k in keys)
    assert [lim.in_flight(k) for k in keys] == [1] * 20

    async def asyncio_side() -> int:
        alim = tb_asyncio.Limiter(redis.asyncio.cluster.RedisCluster(host="127.0.0.1", port=cluster.port))
        async with alim.hold(lease_key, STREAMS, buckets=[(user_key, USER, 1)]):
            held = await alim.in_flight(lease_key)
        await alim.aclose()
        return held

    assert run(asyncio_side()) == 1 and lim.in_flight(lease_key) == 0


# ---- the failure policy ------------------------------------------------------------------


def test_the_policy_answers_an_acquire_while_redis_is_down():
    port = free_port()  # nothing listens there
    events: list[DecisionEvent] = []
    lim = Limiter(redis.Redis(port=port), breaker=False, on_decision=events.append)
    with pytest.raises(redis.ConnectionError):
        lim.acquire("rl:streams:z", STREAMS)
    opened = lim.acquire("rl:streams:z", STREAMS, buckets=[("rl:user:z", USER, 1)], on_error="open")
    assert opened.acquired and opened.degraded and opened.decisions[0].degraded
    assert lim.leases_held == 1  # held by this process, with no slot anywhere
    # No slot anywhere: renewing keeps it, releasing ends it, without Redis.
    assert lim.renew(opened) is True and lim.release(opened) is True and lim.release(opened) is False
    assert lim.leases_held == 0
    closed = lim.acquire("rl:streams:z", STREAMS, on_error="closed")
    assert not closed.acquired and closed.degraded and closed.retry_after_ms == 0 and lim.leases_held == 0
    assert lim.renew(closed) is False and lim.release(closed) is False
    with pytest.raises(Busy, match="Redis failed"), lim.hold("rl:streams:z", STREAMS, on_error="closed"):
        pytest.fail("held without a slot")
    with lim.hold("rl:streams:z", STREAMS, on_error="open") as lease:
        assert lease.degraded
    # Renewing or releasing a lease Redis holds raises while Redis is down.
    held = Lease(True, 1, 0, 60_000, "id", "rl:streams:z", STREAMS)
    with pytest.raises(redis.ConnectionError):
        lim.renew(held)
    with pytest.raises(redis.ConnectionError):
        lim.in_flight("rl:streams:z")
    assert [(e.op, e.policy, e.allowed, e.degraded, e.backend) for e in events] == [
        ("acquire", "streams,user", True, True, ""),
        ("acquire", "streams", False, True, ""),
        ("acquire", "streams", False, True, ""),
        ("acquire", "streams", True, True, ""),
    ]


def test_local_leases_are_a_share_of_the_limit_per_process():
    lim = Limiter(redis.Redis(port=free_port()), on_error="local", processes=2, breaker=False)
    four = Concurrency(4, 60_000, name="streams")
    leases = [lim.acquire("rl:streams:l", four) for _ in range(3)]
    assert [lease.acquired for lease in leases] == [True, True, False]
    assert all(lease.degraded for lease in leases) and leases[2].busy
    assert leases[0].concurrency.limit == 2  # decided against this process's share
    # The buckets are this process's share too: 1.5 of 3 tokens.
    charged = lim.acquire("rl:streams:l4", four, buckets=[("rl:user:l", USER, 1)])
    assert charged.acquired and [d.remaining for d in charged.decisions] == [0]
    assert lim.leases_held == 3
    # The local lease is renewed and released where it was taken.
    assert lim.renew(leases[0]) is True and lim.release(leases[0]) is True and lim.release(leases[0]) is False
    assert lim.leases_held == 2
    assert lim.acquire("rl:streams:l", four).acquired
    # A weight that can't fit a process's share is denied, never an error.
    assert not lim.acquire("rl:streams:l2", four, 3).acquired
    # At least one slot per process, whatever the share.
    one = lim.acquire("rl:streams:l3", Concurrency(1, 60_000))
    assert one.acquired and one.degraded


def test_local_leases_on_a_key_that_keeps_a_summary():
    """Past 8 leases the library keeps a summary and reads its list field
    (HGET) for a denial's wait: the local fallback runs it too."""
    lim = Limiter(redis.Redis(port=free_port()), on_error="local", processes=1, breaker=False)
    twelve = Concurrency(12, 60_000, name="streams")
    start = time.monotonic()
    leases = [lim.acquire("rl:streams:big", twelve) for _ in range(13)]
    took_ms = (time.monotonic() - start) * 1000
    assert [lease.acquired for lease in leases] == [True] * 12 + [False]
    assert leases[12].busy and leases[12].in_use == 12
    # The earliest of them ends a minute after it was taken: the wait says so.
    assert 60_000 - took_ms - 1 <= leases[12].retry_after_ms <= 60_000
    assert lim.release(leases[0]) is True
    assert lim.acquire("rl:streams:big", twelve).acquired


def test_acquires_sent_before_a_busy_loop_get_redis_answers(module_target: Target):
    """A pool of one connection, a budget of 50 ms, the loop held for 300 ms
    once 10 acquires are sent: each gets Redis's answer (two slots, eight
    busy), none is shed, under every policy."""

    async def main(policy: Any) -> tuple[list[Lease], str]:
        client = module_target.async_client(max_connections=1)
        lim = tb_asyncio.Limiter(client, timeout=0.05, on_error=policy)
        try:
            await lim.in_flight("rl:streams:s")  # connected

            async def hold_the_loop() -> None:
                await asyncio.sleep(0)  # the acquires are sent
                time.sleep(0.3)

            *out, _ = await asyncio.gather(*(lim.acquire("rl:streams:s", STREAMS) for _ in range(10)), hold_the_loop())
            return out, lim.breaker_state
        finally:
            await lim.aclose()

    for policy in ("open", "closed", "raise", "local"):
        out, state = run(main(policy))
        assert sum(lease.acquired for lease in out) == STREAMS.limit, policy  # Redis's answers
        assert not any(lease.degraded or lease.shed for lease in out), policy
        assert state == "closed"
        with module_target.admin() as admin:
            admin.delete("rl:streams:s")


def test_a_lease_acquire_forgets_the_cached_denials_of_its_buckets(module_target: Target):
    lim = Limiter(module_target.client(), denial_cache=100)
    three = Bucket(3, SLOW, name="user")
    assert lim.consume("rl:user:c", three, 2).allowed
    assert not lim.consume("rl:user:c", three, 2).allowed  # 1 left: remembered
    assert lim.consume("rl:user:c", three, 2).cached
    assert lim.acquire("rl:streams:c", STREAMS, buckets=[("rl:user:c", three, 1)]).acquired
    # The acquire charged the bucket: what the cache knew of it is stale.
    again = lim.consume("rl:user:c", three, 2)
    assert not again.allowed and not again.cached and again.remaining == 0


def test_hold_logs_renewals_redis_could_not_take(own_server: Server, caplog: pytest.LogCaptureFixture):
    caplog.set_level(logging.WARNING, "redis_tokenbucket")
    lim = Limiter(own_server.client(), breaker=False)
    with lim.hold("rl:streams:f", Concurrency(1, 3000)) as lease:
        own_server.pause()
        until(lambda: "a renewal failed" in caplog.text, 5, "a failed renewal logged")
        own_server.resume()
        assert not lease.lost  # a failure is not a lost lease


class _Replies:
    """A blocking client that answers each command with the next reply
    given (an old server's: a re-acquire charges its buckets again)."""

    def __init__(self, *replies: Any) -> None:
        self.replies = list(replies)
        self.sent: list[tuple[Any, ...]] = []

    def execute_command(self, *args: Any, **options: Any) -> Any:
        self.sent.append(args)
        return self.replies.pop(0)


def test_busy_does_not_count_a_re_acquires_own_weight_twice():
    """Issue 35: a re-acquire of a held lease that only a bucket denies is
    not busy (its own weight is in in_use already); one whose new weight
    doesn't fit beside the others is, as is another id's acquire."""
    client = _Replies(
        [1, 2, 0, 30_000, [1, 2, 0, 1000]],  # taken: in_use 2, its own 1 and another's
        [0, 2, 2000, 0, [0, 0, 2000, 3000]],  # again: the bucket can't pay
        [0, 2, 1000, 0],  # again with weight 2: no room beside the other
        [0, 2, 2000, 0, [0, 0, 2000, 3000]],  # another id: no room, nor tokens
    )
    lim = Limiter(client, backend="module", breaker=False)  # type: ignore[arg-type]
    two = Concurrency(2, 30_000)
    bucket = [("rl:tok", Bucket(3, 1), 1)]
    assert lim.acquire("rl:s", two, buckets=bucket, id="L").acquired
    again = lim.acquire("rl:s", two, buckets=bucket, id="L")
    assert (again.acquired, again.in_use, again.busy, len(again.denied_by)) == (False, 2, False, 1)
    assert "slots in use" not in str(Busy(again))
    heavier = lim.acquire("rl:s", two, 2, id="L")
    assert (heavier.acquired, heavier.busy) == (False, True)
    other = lim.acquire("rl:s", two, buckets=bucket, id="M")
    assert (other.acquired, other.busy) == (False, True)
    assert [args[4] for args in client.sent] == ["L", "L", "L", "M"]


def test_the_breaker_open_a_stream_ends_and_its_slot_is_free_at_once(module_target: Target):
    """Issue 35: while the breaker is open, a renewal and the release of a
    stream that ends go out, and never count for the breaker."""
    breaker = Breaker(1, 10, 60)
    lim = Limiter(module_target.client(), on_error="closed", breaker=breaker)
    one = Concurrency(1, 60_000)
    admin = module_target.admin()
    with lim.hold("rl:bo", one) as lease:
        assert admin.execute_command("TB.INFLIGHT", "rl:bo") == 1
        breaker.failure(False)  # Redis failed a call elsewhere: the breaker opens
        assert lim.breaker_state == "open"
        assert lim.renew(lease) is True, "a renewal goes out too"
    assert admin.execute_command("TB.INFLIGHT", "rl:bo") == 0, "released at once, not at expiry"
    assert lim.breaker_state == "open", "releases never count for the breaker"
    assert lim.leases_held == 0
    assert lim.acquire("rl:bo", one).degraded  # decisions still get the policy at once


def test_the_asyncio_limiter_releases_past_the_open_breaker(module_target: Target):
    async def main() -> tuple[int, str, int]:
        breaker = Breaker(1, 10, 60)
        async with tb_asyncio.Limiter(module_target.async_client(), on_error="closed", breaker=breaker) as lim:
            async with lim.hold("rl:bo", Concurrency(1, 60_000)) as lease:
                breaker.failure(False)
                assert await lim.renew(lease) is True
            return lim.breaker_state, lim.leases_held

    assert run(main()) == ("open", 0)
    assert module_target.admin().execute_command("TB.INFLIGHT", "rl:bo") == 0, "released at once"


class _SlowReply:
    """A TCP proxy to a server that holds back the next reply it forwards
    by `delay` seconds, once armed: a command that runs in Redis and whose
    reply comes after the limiter's budget."""

    def __init__(self, port: int) -> None:
        self.target = port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.delay = 0.0
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def arm(self, delay: float) -> None:
        with self.lock:
            self.delay = delay

    def _accept(self) -> None:
        while True:
            try:
                near, _ = self.listener.accept()
            except OSError:
                return  # closed
            far = socket.create_connection(("127.0.0.1", self.target))
            threading.Thread(target=self._pipe, args=(near, far, False), daemon=True).start()
            threading.Thread(target=self._pipe, args=(far, near, True), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, replies: bool) -> None:
        try:
            while data := src.recv(65536):
                if replies:
                    with self.lock:
                        delay, self.delay = self.delay, 0.0
                    time.sleep(delay)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            src.close()
            dst.close()

    def close(self) -> None:
        self.listener.close()


def test_an_acquire_whose_reply_is_lost_leaves_no_slot_held_once_its_release_has_run(module_target: Target):
    """Issue 35: TB.ACQUIRE runs in Redis and its reply comes after the
    budget; the limiter releases its id (given, or one it made) before it
    answers, so no slot is left held until the lease expires."""
    proxy = _SlowReply(module_target.server.port)
    admin = module_target.admin()
    one = Concurrency(1, 60_000)
    try:
        for lim in (
            Limiter(redis.Redis(port=proxy.port), backend="module", on_error="closed", timeout=0.05, breaker=False),
            Limiter(redis.Redis(port=proxy.port), backend="module", on_error="raise", timeout=0.05, breaker=False),
        ):
            for lease_id in ("lost-1", None):
                admin.config_resetstat()
                proxy.arm(0.3)
                try:
                    lease = lim.acquire("rl:lost", one, id=lease_id)
                    assert (lease.acquired, lease.degraded, lease.held) == (False, True, "none")
                except redis.exceptions.TimeoutError:
                    assert lim.on_error == "raise"
                assert calls(admin, "tb.acquire") == 1, "it ran in Redis"
                assert calls(admin, "tb.release") == 1, "and its release too"
                assert admin.execute_command("TB.INFLIGHT", "rl:lost") == 0, "the slot is free"
                assert lim.leases_held == 0
        assert Limiter(module_target.client()).acquire("rl:lost", one).acquired
    finally:
        proxy.close()
