"""cluster_mode=True on a real 3-shard Redis Cluster, where the user, key
and IP buckets live in different slots: TB.CONSUME per bucket with
TB.ADJUST refunds, and the Lua library loaded on every primary."""

from __future__ import annotations

import math
from typing import Iterator

import pytest
import redis
from fastapi.testclient import TestClient
from redis_tokenbucket import CrossSlotError, Limiter
from tbasgi import PeerFromHeader
from tbservers import Cluster

import app as gateway
from config import Settings, key_id
from conftest import API_KEYS, LIMITS, auth, bucket


@pytest.fixture(scope="module", params=["module", "lua"])
def cluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    workdir = tmp_path_factory.mktemp(f"cluster-{request.param}")
    c = Cluster("redis-7.0", workdir, module=request.param == "module").start()
    yield c
    c.stop()


def backend(cluster: Cluster) -> str:
    return "module" if cluster.nodes[0].module else "functions"


@pytest.fixture
def rc(cluster: Cluster) -> Iterator[redis.RedisCluster]:
    client = redis.RedisCluster(host="127.0.0.1", port=cluster.port, decode_responses=True)
    client.flushall()
    client.function_flush()
    yield client
    client.close()


@pytest.fixture
def client(cluster: Cluster, rc: redis.RedisCluster) -> Iterator[TestClient]:
    # No redis_factory: the app builds its own RedisCluster client.
    limits = LIMITS.model_copy(update={"ip": bucket(2)})
    settings = Settings(redis_url=cluster.nodes[0].url, cluster_mode=True, limits=limits, api_keys=API_KEYS)
    with TestClient(PeerFromHeader(gateway.create_app(settings))) as c:
        yield c


def tokens(rc: redis.RedisCluster, key: str) -> float | None:
    value = rc.hget(key, "tokens")
    return None if value is None else float(value)


def test_buckets_are_in_different_slots(rc):
    keys = ["rl:user:u-free", f"rl:key:{key_id('k-free')}", "rl:ip:203.0.113.7", "rl:llm:user:u-free"]
    assert len({rc.keyslot(k) for k in keys}) == 4


def test_ip_denial_is_refunded_across_slots(client, cluster, rc):
    assert client.get("/readyz").json() == {"ready": True, "backend": backend(cluster), "breaker": "closed"}
    assert [client.get("/v1/models", headers=auth("k-free")).status_code for _ in range(2)] == [200, 200]
    denied = client.get("/v1/models", headers=auth("k-free2"))
    assert denied.status_code == 429 and denied.json()["dimension"] == "ip"
    # Charged, then refunded to full: no key left.
    assert rc.exists("rl:user:u-free2") == 0 and rc.exists(f"rl:key:{key_id('k-free2')}") == 0
    assert client.get("/v1/models", headers=auth("k-free")).status_code == 429
    assert math.floor(tokens(rc, "rl:user:u-free")) == 1 and math.floor(tokens(rc, f"rl:key:{key_id('k-free')}")) == 3
    if backend(cluster) == "functions":  # loaded on every primary, not just one
        assert all(redis.Redis(port=n.port).function_list(library="tb") for n in cluster.nodes)


def test_chat_reserve_and_settle_across_slots(client, rc):
    res = client.post("/v1/chat", headers=auth("k-free"), json={"prompt": "a b c d", "max_tokens": 10})
    assert res.status_code == 200
    assert math.floor(tokens(rc, "rl:llm:user:u-free")) == 100 - 8


def test_mconsume_needs_one_slot(cluster, rc):
    """Why cluster_mode exists: one TB.MCONSUME (or FCALL tb_mconsume)
    can't span slots; asked for one atomic call, the limiter refuses."""
    groups = [("rl:user:x", bucket(3).named("user"), 1), ("rl:ip:x", bucket(3).named("ip"), 1)]
    with pytest.raises(CrossSlotError, match="slot"):
        Limiter(rc).consume_many(groups, atomic=True)


def test_a_streamed_chat_across_slots(client, rc):
    """The stream's slots are taken first (the deployment's, then the
    user's), then the buckets one by one; after the last byte the slots are
    given back and the budget settled."""
    body = {"prompt": "a b c d", "max_tokens": 10, "stream": True}
    res = client.post("/v1/chat", headers=auth("k-free"), json=body)
    assert res.status_code == 200 and res.text.endswith("data: [DONE]\n\n")
    assert res.headers["RateLimit-Policy"].startswith(
        '"model_streams";q=5;qu="concurrent-requests", "streams";q=2;qu="concurrent-requests", "user";q=3;'
    )
    assert rc.exists("rl:streams:u-free") == 0 and rc.exists("rl:streams:deployment") == 0
    assert math.floor(tokens(rc, "rl:llm:user:u-free")) == 100 - 8
    # A bucket that denies gives the slot back: the IP bucket holds 2.
    client.get("/v1/models", headers=auth("k-free2"))
    client.get("/v1/models", headers=auth("k-free2"))
    denied = client.post("/v1/chat", headers=auth("k-free"), json=body)
    assert denied.status_code == 429 and denied.json()["dimension"] == "ip"
    assert rc.exists("rl:streams:u-free") == 0 and rc.exists("rl:streams:deployment") == 0
