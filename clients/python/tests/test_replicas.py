"""`wait_replicas`: WAIT pipelined behind every consume,
consume_many and acquire, on every backend. A primary without a replica
(WAIT 1 answers 0): an admission becomes the route's on_error answer and
counts for the breaker; a denial stands. A primary with a replica the
test starts (REPLICAOF): Redis's decision stands."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import redis.asyncio
import redis.cluster
from conftest import SLOW, Pool, Target, calls, make_target, run
from tbservers import Server

import redis_tokenbucket.asyncio as tb_asyncio
from redis_tokenbucket import Breaker, Bucket, CircuitOpenError, Concurrency, Limiter, ReplicasBehind

TWO = Bucket(2, SLOW, name="user")
ONE_SLOT = Concurrency(1, 60_000)

# One server per backend: the module, the Functions library, the EVAL script.
BACKENDS = ["redis-7.0+module", "redis-7.0", "redis-6.2"]


@pytest.fixture(params=BACKENDS)
def backend_target(request: pytest.FixtureRequest, pool: Pool) -> Target:
    return make_target(pool, request.param)


def test_the_options_are_checked():
    client = redis.Redis(port=1)
    for bad in (-1, 1.0, True, "1"):
        with pytest.raises(ValueError, match="wait_replicas"):
            Limiter(client, wait_replicas=bad)  # type: ignore[arg-type]
    for bad_timeout in (0, -0.1, float("inf"), True, "0.05"):
        with pytest.raises(ValueError, match="wait_timeout"):
            Limiter(client, wait_replicas=1, wait_timeout=bad_timeout)  # type: ignore[arg-type]
    assert Limiter(client).wait_replicas == 0  # off by default
    with pytest.raises(ValueError, match="wait_timeout"):
        tb_asyncio.Limiter(redis.asyncio.Redis(port=1), wait_timeout=0)


def test_a_cluster_client_is_refused(pool: Pool):
    cluster = pool.cluster(True)
    client = redis.cluster.RedisCluster(host="127.0.0.1", port=cluster.port)
    try:
        with pytest.raises(ValueError, match="wait_replicas is for one primary and its replicas"):
            Limiter(client, wait_replicas=1)
        assert Limiter(client, wait_replicas=0).wait_replicas == 0
    finally:
        client.close()


def test_no_replica_an_admission_is_the_policy_answer_a_denial_stands(backend_target: Target):
    admin = backend_target.admin()
    breaker = Breaker(2, 10, 60)
    lim = Limiter(backend_target.client(), wait_replicas=1, wait_timeout=0.02, on_error="closed", breaker=breaker)
    assert lim.detect() == backend_target.backend  # a peek: no WAIT
    admin.config_resetstat()
    d = lim.consume("rl:w", TWO)
    assert (d.allowed, d.degraded) == (False, True), "WAIT 1 answered 0: Redis failing, as the policy goes"
    assert breaker.state == "closed"
    assert lim.peek("rl:w", TWO).remaining == 1, "the primary took the token (and peek waits for nothing)"
    denied = lim.consume("rl:w", TWO, 2)
    assert (denied.allowed, denied.degraded, denied.remaining) == (False, False, 1), "a denial wrote nothing"
    assert breaker.state == "closed"
    many = lim.consume_many([("rl:w2", TWO), ("rl:w3", TWO)], on_error="open")
    assert (many.allowed, many.degraded) == (True, True)
    assert breaker.state == "open"  # two failures
    assert calls(admin, "wait") == 3, "one behind each write, none behind the peek"
    with pytest.raises(CircuitOpenError):
        lim.consume("rl:w", TWO, on_error="raise")


def test_no_replica_an_acquire_is_released_and_raise_raises(backend_target: Target):
    lim = Limiter(backend_target.client(), wait_replicas=1, wait_timeout=0.02, breaker=False)
    with pytest.raises(ReplicasBehind, match="0 of 1 replicas acknowledged the write within 20 ms"):
        lim.acquire("rl:ws", ONE_SLOT, id="w")
    assert lim.in_flight("rl:ws") == 0, "the slot the primary gave is released"
    assert lim.leases_held == 0


def test_the_asyncio_limiter_waits_too(backend_target: Target):
    async def main() -> list[object]:
        client = backend_target.async_client()
        async with tb_asyncio.Limiter(
            client, wait_replicas=1, wait_timeout=0.02, on_error="open", breaker=False
        ) as lim:
            await lim.detect()
            backend_target.admin().config_resetstat()
            admitted = await lim.consume("rl:wa", TWO)
            denied = await lim.consume("rl:wa", TWO, 2)
            lease = await lim.acquire("rl:was", ONE_SLOT)
            return [admitted.degraded, denied.degraded, denied.allowed, lease.degraded, await lim.in_flight("rl:was")]

    assert run(main()) == [True, False, False, True, 0]
    assert calls(backend_target.admin(), "wait") == 3  # the acquire's release waits for none


@pytest.fixture
def primary_with_replica(tmp_path: Path) -> Iterator[Server]:
    # No delay before a diskless full sync (5 s by default).
    primary = Server("redis-7.0", tmp_path / "primary", "--repl-diskless-sync-delay", "0", module=True).start()
    replica = Server("redis-7.0", tmp_path / "replica", module=True).start()
    try:
        with replica.client() as r:
            r.replicaof("127.0.0.1", primary.port)
        deadline = time.monotonic() + 15
        with primary.client(decode_responses=True) as p:
            while p.info("replication").get("slave0", {}).get("state") != "online":
                assert time.monotonic() < deadline, "the replica never came online"
                time.sleep(0.02)
            # A replica fresh from its full sync may acknowledge its first
            # write a second late: one write, waited for, then it answers
            # each WAIT at once.
            p.set("warm", 1)
            assert p.wait(1, 10_000) == 1
        yield primary
    finally:
        replica.stop()
        primary.stop()


@pytest.mark.parametrize("backend", ["module", "functions", "eval"])
def test_with_a_replica_the_decision_stands(primary_with_replica: Server, backend: str):
    breaker = Breaker(1, 10, 60)
    lim = Limiter(primary_with_replica.client(), backend=backend, wait_replicas=1, on_error="closed", breaker=breaker)
    # The library loaded (or the script cached) and replicated first: the
    # replica compiles it too, which takes longer than a request's wait.
    assert lim.detect() == backend
    with primary_with_replica.client() as admin:
        admin.set("warm", 2)
        assert admin.wait(1, 10_000) == 1
    assert [lim.consume(f"rl:r:{backend}", TWO).allowed for _ in range(3)] == [True, True, False]
    assert not lim.consume(f"rl:r:{backend}", TWO).degraded
    lease = lim.acquire(f"rl:rs:{backend}", ONE_SLOT)
    assert (lease.acquired, lease.degraded) == (True, False)
    assert lim.consume_many([(f"rl:r1:{backend}", TWO), (f"rl:r2:{backend}", TWO)]).allowed
    assert breaker.state == "closed"
    assert calls(primary_with_replica.client(decode_responses=True), "wait") >= 6
