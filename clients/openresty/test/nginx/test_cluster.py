"""A Redis Cluster of 3 primaries: MOVED followed and each slot's node
remembered; a user's buckets share a slot through a hash tag and are one
TB.MCONSUME; a bucket in another slot (the IP) goes bucket by bucket, with
refunds. With the module, and with the Lua library loaded by the limiter
on each primary it reaches."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
from conftest import SLOW, burst, one_limiter
from redis.crc import key_slot
from tbservers import Cluster


@pytest.fixture(scope="module", params=["module", "library"])
def cluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster("redis-7.0", tmp_path_factory.mktemp("cluster"), module=request.param == "module").start()
    yield c
    c.stop()


def owner(cluster: Cluster, key: str) -> redis.Redis:
    """A client of the primary that holds `key`'s slot."""
    slot = key_slot(key.encode())
    for node in cluster.nodes:
        with node.client(decode_responses=True) as c:
            for start, end, *_ in c.execute_command("CLUSTER", "SLOTS"):
                if start <= slot <= end and _[0][1] == node.port:
                    return node.client()
    raise AssertionError(f"no node holds slot {slot}")


RULES = [
    f'{{ name = "user", max = 6, rate = {SLOW}, key = "$http_x_user", hash_tag = true }}',
    f'{{ name = "llm", max = 100, rate = {SLOW}, key = "$http_x_user", hash_tag = true, cost = 10 }}',
]


def test_a_users_buckets_in_one_slot_exact_across_workers(cluster, nginx):
    n = nginx(one_limiter(cluster.nodes[0].url, cluster=True, rules=RULES))
    for user in ("alice", "bob", "carol"):
        res = burst([(n.port, "/limited")] * 15, {"X-User": user})
        assert [x.status for x in res].count(200) == 6, user
        node = owner(cluster, f"rl:user:{{{user}}}")
        assert int(float(node.hget(f"rl:llm:{{{user}}}", "tokens"))) == 40
        assert int(float(node.hget(f"rl:user:{{{user}}}", "tokens"))) == 0


def test_buckets_in_several_slots_go_one_by_one_with_refunds(cluster, nginx):
    rules = [
        f'{{ name = "ip", max = 100, rate = {SLOW}, key = "$http_x_ip" }}',
        f'{{ name = "user", max = 2, rate = {SLOW}, key = "$http_x_user", hash_tag = true }}',
    ]
    n = nginx(one_limiter(cluster.nodes[0].url, cluster=True, rules=rules), workers=1)
    headers = {"X-User": "dave", "X-Ip": "198.51.100.7"}
    assert key_slot(b"rl:ip:198.51.100.7") != key_slot(b"{dave}")
    assert [n.get("/limited", headers).status for _ in range(4)] == [200, 200, 429, 429]
    # The two denials were refunded: the IP bucket paid for the admissions only.
    ip = owner(cluster, "rl:ip:198.51.100.7")
    assert int(float(ip.hget("rl:ip:198.51.100.7", "tokens"))) == 98
