"""The request buckets: capacity, Retry-After, all-or-nothing, tiers."""

from __future__ import annotations

import time

import pytest

from config import Limits, key_id
from conftest import LIMITS, PRINCIPALS, SLOW, auth, bucket, tier


def test_capacity_plus_one_gives_one_429_and_retry_after_is_right(make_client, cluster_mode):
    # A burst of 3 refilling at 1/s: the 4th request waits just under 1 s.
    limits = Limits(tiers={"free": tier(bucket(3, rate=1), bucket(5))}, ip=bucket(50))
    client = make_client(limits=limits, cluster_mode=cluster_mode)
    codes = [client.get("/v1/models", headers=auth("k-free")).status_code for _ in range(4)]
    assert codes == [200, 200, 200, 429]

    denied = client.get("/v1/models", headers=auth("k-free"))
    assert denied.status_code == 429
    assert denied.headers["Retry-After"] == "1"
    assert denied.json() == {"error": "rate_limited", "dimension": "user", "retry_after": 1}

    time.sleep(int(denied.headers["Retry-After"]))
    assert client.get("/v1/models", headers=auth("k-free")).status_code == 200
    # One token came back, and that request took it.
    assert client.get("/v1/models", headers=auth("k-free")).status_code == 429


def test_ip_denial_charges_neither_user_nor_key(make_client, server, r, cluster_mode):
    limits = LIMITS.model_copy(update={"ip": bucket(2)})
    client = make_client(limits=limits, cluster_mode=cluster_mode)
    free = LIMITS.tiers["free"]

    def user_and_key(raw: str) -> tuple[int, int]:
        user = server.peek(r, f"rl:user:{PRINCIPALS[raw].user_id}", free.user)
        key = server.peek(r, f"rl:key:{key_id(raw)}", free.key)
        return user[1], key[1]

    # Two requests from one address empty its IP bucket (user and key keep 3-2, 5-2).
    assert [client.get("/v1/models", headers=auth("k-free")).status_code for _ in range(2)] == [200, 200]
    assert user_and_key("k-free") == (1, 3)

    # Another user behind the same address is turned away by the IP bucket...
    denied = client.get("/v1/models", headers=auth("k-free2"))
    assert denied.status_code == 429 and denied.json()["dimension"] == "ip"
    # ...and its own buckets are untouched: never written (or, in cluster
    # mode, charged and refunded back to full, which deletes the key).
    assert r.exists("rl:user:u-free2", f"rl:key:{key_id('k-free2')}") == 0
    assert user_and_key("k-free2") == (3, 5)

    # A user with a partly spent bucket keeps its balance too.
    assert client.get("/v1/models", headers=auth("k-free")).status_code == 429
    assert user_and_key("k-free") == (1, 3)


@pytest.mark.parametrize(
    "key, passes, dimension",
    [
        ("k-free", 3, "user"),
        ("k-std", 4, "user"),
        ("k-ent", 5, "key"),  # enterprise: the key (5) is tighter than the user (8)
        ("k-gold", 3, "user"),  # unknown tier: free
        ("k-none", 3, "user"),  # no tier: free
    ],
)
def test_tier_limits_apply(make_client, key, passes, dimension):
    client = make_client()
    codes = [client.get("/v1/models", headers=auth(key)).status_code for _ in range(passes + 1)]
    assert codes == [200] * passes + [429]
    denied = client.get("/v1/models", headers=auth(key))
    assert denied.json()["dimension"] == dimension


def test_one_redis_call_per_request(make_client, server, r):
    client = make_client()
    assert client.get("/readyz").json()["backend"] == server.backend  # detection done
    r.config_resetstat()
    for _ in range(3):
        client.get("/v1/models", headers=auth("k-free"))
    stats = {name: s["calls"] for name, s in r.info("commandstats").items()}
    assert stats.pop("cmdstat_tb.mconsume" if server.with_module else "cmdstat_fcall") == 3
    assert not [n for n in stats if n.startswith(("cmdstat_tb.", "cmdstat_fcall"))]


def test_cluster_mode_answers_like_mconsume(make_client, server, r):
    """The same requests in both modes: same statuses, bodies and headers,
    same balances afterwards (the refunds undo every partial charge)."""
    # The last request is denied by both the key and the IP bucket. The IP
    # refills at half the speed, so its retry time is the longer one by far:
    # equal times would be decided by the order of the buckets, and cluster
    # mode reads them a moment apart.
    limits = Limits(tiers={"free": tier(bucket(3), bucket(2))}, ip=bucket(4, rate=SLOW / 2))
    script = ["k-free"] * 3 + ["k-free2"] * 3 + ["k-free"]
    names = ("RateLimit", "RateLimit-Policy", "Retry-After", "X-RateLimit-Limit", "X-RateLimit-Remaining")

    def run(cluster_mode: bool) -> tuple[list, list]:
        r.flushall()
        client = make_client(limits=limits, cluster_mode=cluster_mode)
        answers = []
        for key in script:
            res = client.get("/v1/models", headers=auth(key))
            answers.append((res.status_code, res.json(), [res.headers.get(n) for n in names]))
        free = limits.tiers["free"]
        buckets = {"rl:ip:203.0.113.7": limits.ip}
        for raw in ("k-free", "k-free2"):
            buckets[f"rl:user:{PRINCIPALS[raw].user_id}"] = free.user
            buckets[f"rl:key:{key_id(raw)}"] = free.key
        balances = [server.peek(r, key, b)[:2] for key, b in buckets.items()]
        return answers, balances

    together, each = run(False), run(True)
    assert [a[0] for a in together[0]] == [200, 200, 429, 200, 200, 429, 429]
    for step, (a, b) in enumerate(zip(together[0], each[0])):
        assert (step, a) == (step, b)
    assert each[1] == together[1]


def test_no_raw_api_key_reaches_redis(make_client, r):
    client = make_client()
    client.get("/v1/models", headers=auth("k-free"))
    client.post("/v1/chat", headers=auth("k-std"), json={"prompt": "hello there", "max_tokens": 5})
    client.get("/v1/models", headers=auth("not-a-key"))
    keys = r.keys("*")
    assert f"rl:key:{key_id('k-free')}" in keys and f"rl:key:{key_id('k-std')}" in keys
    dump = " ".join(keys + [v for k in keys for v in r.hgetall(k).values()])
    assert not any(raw in dump for raw in [*PRINCIPALS, "not-a-key"])


def test_unauthenticated_requests_pay_their_ip_bucket(make_client, r):
    client = make_client()
    assert client.get("/v1/models").status_code == 401
    assert client.get("/v1/models", headers=auth("wrong")).status_code == 401
    assert r.keys("*") == ["rl:ip:203.0.113.7"]
