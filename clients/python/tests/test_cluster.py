"""A Redis Cluster of 3 primaries, with and without the module: routing,
the library on every primary, and consume_many across slots (bucket by
bucket, refunded on denial) or in one slot (one atomic call)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis
from conftest import SLOW, Pool, Target, calls, clean, run
from redis.asyncio.cluster import ClusterNode as AsyncClusterNode
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import ClusterNode, RedisCluster
from tbservers import Cluster, free_port

import redis_tokenbucket.asyncio as tb_asyncio
from redis_tokenbucket import Bucket, CrossSlotError, Limiter, hash_tagged
from redis_tokenbucket._scripts import library_source, library_version

USER = Bucket(3, SLOW, name="user")
IP = Bucket(1, SLOW, name="ip")


@pytest.fixture(params=[True, False], ids=["module", "functions"])
def cluster(request: pytest.FixtureRequest, pool: Pool) -> Cluster:
    c = pool.cluster(request.param)
    for node in c.nodes:
        clean(node)
    return c


@pytest.fixture
def rc(cluster: Cluster) -> Iterator[RedisCluster]:
    client = RedisCluster(host="127.0.0.1", port=cluster.port)
    yield client
    client.close()


def dead_port() -> int:
    return free_port()  # nothing listens there


def backend(cluster: Cluster) -> str:
    return "module" if cluster.nodes[0].module else "functions"


def everywhere(cluster: Cluster, *commands: str) -> list[int]:
    out = []
    for node in cluster.nodes:
        with node.client(decode_responses=True) as r:
            out.append(calls(r, *commands))
    return out


def test_keys_on_every_shard(cluster: Cluster, rc: RedisCluster):
    keys = [f"rl:user:{i}" for i in range(12)]
    assert len({rc.get_node_from_key(k).name for k in keys}) == 3
    lim = Limiter(rc)
    assert [lim.consume(k, USER).remaining for k in keys] == [2] * 12
    assert lim.backend == backend(cluster)
    if lim.backend == "functions":  # loaded on every primary at once
        for node in cluster.nodes:
            with node.client() as r:
                assert r.function_list(library="tb")


def test_across_slots_charges_bucket_by_bucket_and_refunds(cluster: Cluster, rc: RedisCluster, module_target: Target):
    lim = Limiter(rc)
    user, ip = "rl:user:u1", "rl:ip:198.51.100.7"
    assert rc.keyslot(user) != rc.keyslot(ip)
    ok = lim.consume_many([(user, USER), (ip, IP)])
    assert ok.allowed and not ok.atomic
    assert [d.remaining for d in ok.decisions] == [2, 0]
    # The IP bucket is empty now: another user behind it is turned away...
    denied = lim.consume_many([("rl:user:u2", USER), (ip, IP), ("rl:key:k2", USER)])
    assert not denied.allowed and not denied.atomic
    assert [d.allowed for d in denied.decisions] == [True, False, True]
    assert [d.remaining for d in denied.decisions] == [3, 0, 3]
    assert denied.retry_after_ms == denied.decisions[1].retry_after_ms > 0
    # ...its user bucket charged and refunded (back to full: no key), the
    # one after the IP only peeked at.
    assert rc.exists("rl:user:u2", "rl:key:k2") == 0
    assert lim.peek(user, USER).remaining == 2
    # The answer is the one TB.MCONSUME gives on one node.
    with module_target.client() as single:
        lim1 = Limiter(single)
        lim1.consume_many([("a", USER), ("b", IP)])
        one = lim1.consume_many([("c", USER), ("b", IP), ("d", USER)])
    assert (one.allowed, [(d.allowed, d.remaining) for d in one.decisions]) == (
        denied.allowed,
        [(d.allowed, d.remaining) for d in denied.decisions],
    )


def test_reset_reaches_each_keys_node(cluster: Cluster, rc: RedisCluster):
    keys = [f"rl:user:{i}" for i in range(12)]
    lim = Limiter(rc)
    for k in keys:
        lim.consume(k, USER)
    assert all(lim.reset(k) for k in keys)
    assert sum(rc.exists(k) for k in keys) == 0  # one by one: the keys lie in several slots


def test_atomic_across_slots_is_refused(cluster: Cluster, rc: RedisCluster):
    lim = Limiter(rc)
    with pytest.raises(CrossSlotError, match="one Cluster hash slot") as raised:
        lim.consume_many([("rl:user:u1", USER), ("rl:ip:x", IP)], atomic=True, on_error="open")
    assert "hash_tagged" in str(raised.value)
    assert sum(everywhere(cluster, "tb.consume", "fcall", "tb.mconsume")) == 0
    assert lim.backend is None


def test_hash_tagged_keys_are_one_atomic_call(cluster: Cluster, rc: RedisCluster):
    keys = hash_tagged("user42", "user", "llm")
    assert keys == ["rl:{user42}:user", "rl:{user42}:llm"]
    assert rc.keyslot(keys[0]) == rc.keyslot(keys[1])
    lim = Limiter(rc)
    m = lim.consume_many([(keys[0], USER, 1), (keys[1], Bucket(100_000, 50, name="llm"), 350)], atomic=True)
    assert m.allowed and m.atomic and [d.remaining for d in m.decisions] == [2, 99_650]
    if lim.backend == "module":
        assert sum(everywhere(cluster, "tb.mconsume")) == 1
    assert sum(everywhere(cluster, "tb.consume", "tb.adjust")) == 0


def test_asyncio_cluster(cluster: Cluster):
    async def main() -> tuple[list[bool], list[int], bool, str | None]:
        client = AsyncRedisCluster(host="127.0.0.1", port=cluster.port)
        try:
            lim = tb_asyncio.Limiter(client)
            await lim.consume("rl:ip:y", IP)
            denied = await lim.consume_many([("rl:user:a", USER), ("rl:ip:y", IP)])
            user = await lim.peek("rl:user:a", USER)
            return [d.allowed for d in denied.decisions], [user.remaining], denied.atomic, lim.backend
        finally:
            await client.aclose()

    assert run(main()) == ([True, False], [3], False, backend(cluster))


def test_one_round_trip_per_call_on_the_library(pool: Pool):
    """redis-py would ask a server for FCALL's keys (COMMAND GETKEYS) before
    each call; the limiter sends it to the key's node itself."""
    cluster = pool.cluster(module=False)

    async def asyncio_calls() -> None:
        client = AsyncRedisCluster(host="127.0.0.1", port=cluster.port)
        try:
            lim = tb_asyncio.Limiter(client)
            for i in range(10):
                assert (await lim.peek(f"rl:async:{i}", USER)).allowed
        finally:
            await client.aclose()

    with RedisCluster(host="127.0.0.1", port=cluster.port) as rc:
        lim = Limiter(rc)
        lim.consume("rl:warm", USER)  # detection and library load
        for node in cluster.nodes:
            clean(node)
        keys = [f"rl:user:{i}" for i in range(30)]
        assert [lim.consume(k, USER).remaining for k in keys] == [2] * 30
    run(asyncio_calls())
    # One more FCALL: the first after clean() found no library, loaded it and
    # retried; and the asyncio limiter's tb_version, once on each primary.
    assert sum(everywhere(cluster, "fcall", "fcall_ro")) == 30 + 1 + 10 + 3
    assert sum(everywhere(cluster, "command|getkeys")) == 0


def test_a_node_gone_under_a_routed_call(pool: Pool):
    """The node an FCALL was sent to doesn't answer (a failover): redis-py
    retries only calls it routed itself, so the limiter sends it again
    without a node, and redis-py finds the key's node on a fresh slot map."""
    cluster = pool.cluster(module=False)
    gone = ("127.0.0.1", dead_port())
    key = "rl:user:failover"

    def route_once_to(client: Any, node: Any) -> list[Any]:
        real, routed = client.get_node_from_key, []

        def get_node_from_key(k: Any, *args: Any) -> Any:
            routed.append(k)
            return node if len(routed) == 1 else real(k, *args)

        client.get_node_from_key = get_node_from_key
        return routed

    async def asyncio_call() -> tuple[int, list[Any]]:
        client = AsyncRedisCluster(host="127.0.0.1", port=cluster.port)
        try:
            # A generous budget: a loaded machine must not shed the first
            # call (the slot map and the library) of this routing test.
            lim = tb_asyncio.Limiter(client, backend="functions", timeout=5)
            await lim.consume(key, USER)  # the slot map and the library
            routed = route_once_to(client, AsyncClusterNode(*gone, server_type="primary"))
            return (await lim.consume(key, USER)).remaining, routed
        finally:
            await client.aclose()

    for node in cluster.nodes:
        clean(node)
    with RedisCluster(host="127.0.0.1", port=cluster.port) as rc:
        lim = Limiter(rc, backend="functions", timeout=5)
        assert not lim.consume(key, USER).shed
        routed = route_once_to(rc, ClusterNode(*gone, server_type="primary"))
        assert lim.consume(key, USER).remaining == 1
        assert routed == [key]  # one routed try; the retry was redis-py's to route
    remaining, routed = run(asyncio_call())
    assert remaining == 0 and routed == [key]
    # Each limiter: the first call (the first limiter's tb_version found no
    # library and loaded it), then the retried one; the routed tries met a
    # dead port.
    assert sum(everywhere(cluster, "fcall")) == 2 + 2


def test_a_single_node_always_takes_one_call(module_target: Target):
    """Slots only matter to a cluster client; atomic=False forces the
    bucket-by-bucket path anywhere (it gives the same answer)."""
    with redis.Redis(port=module_target.server.port) as r:
        lim = Limiter(r)
        assert lim.consume_many([("rl:user:u1", USER), ("rl:ip:x", IP)], atomic=True).atomic
        each = lim.consume_many([("rl:user:u2", USER), ("rl:ip:x", IP)], atomic=False)
    assert not each.atomic and [d.allowed for d in each.decisions] == [True, False]


def test_hash_tagged_checks_its_parts():
    for bad in [("", "a"), ("a}b", "a"), ("t",)]:
        with pytest.raises(ValueError):
            hash_tagged(*bad)
    with pytest.raises(ValueError):
        hash_tagged("t", "a", prefix="rl{")


def test_each_primary_gets_our_library(pool: Pool):
    """Each primary has its own library: the package's, an older release's,
    a foreign one. The first call's tb_version asks every primary, and the
    package's copy is loaded on all of them."""
    cluster = pool.cluster(module=False)
    for node in cluster.nodes:
        clean(node)
    ours = library_source()
    version = library_version()
    older = ours.replace(f"local LIBRARY_VERSION = '{version}'".encode(), b"local LIBRARY_VERSION = '0.0.1'")
    foreign = b"#!lua name=tb\nredis.register_function('tb_consume', function() return {1, 42, 0, 0} end)"
    for node, library in zip(cluster.nodes, (ours, older, foreign), strict=True):
        with node.client() as r:
            r.function_load(library)
            r.config_resetstat()
    with RedisCluster(host="127.0.0.1", port=cluster.port) as rc:
        lim = Limiter(rc)
        assert [lim.consume(f"rl:user:{i}", USER).remaining for i in range(12)] == [2] * 12
        assert lim.backend == "functions"
    assert everywhere(cluster, "fcall_ro") == [1, 1, 1]
    for node in cluster.nodes:
        with node.client(decode_responses=True) as r:
            assert r.execute_command("FCALL_RO", "tb_version", 0) == version
