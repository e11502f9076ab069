"""The documented header format, exactly (see README, "Headers")."""

from __future__ import annotations

from config import Limits
from conftest import auth, bucket, tier

# Rates chosen so that every t below is a whole number of seconds with a
# margin of a second or more against the time the test takes.
LIMITS = Limits(tiers={"free": tier(bucket(3, rate=1), bucket(5, rate=0.5))}, ip=bucket(10, rate=1))
POLICY = '"user";q=3;w=3, "key";q=5;w=10, "ip";q=10;w=10'


def test_success_headers(make_client, cluster_mode):
    res = make_client(limits=LIMITS, cluster_mode=cluster_mode).get("/v1/models", headers=auth("k-free"))
    assert res.status_code == 200
    assert res.headers["RateLimit-Policy"] == POLICY
    # Fresh buckets: exactly 1 s, 2 s and 1 s until each is full again.
    assert res.headers["RateLimit"] == '"user";r=2;t=1, "key";r=4;t=2, "ip";r=9;t=1'
    # The tightest bucket: the user's, with 2 of 3 left.
    assert (res.headers["X-RateLimit-Limit"], res.headers["X-RateLimit-Remaining"]) == ("3", "2")
    assert "Retry-After" not in res.headers


def test_denial_headers(make_client, cluster_mode):
    client = make_client(limits=LIMITS, cluster_mode=cluster_mode)
    for _ in range(3):
        client.get("/v1/models", headers=auth("k-free"))
    res = client.get("/v1/models", headers=auth("k-free"))
    assert res.status_code == 429
    assert res.headers["content-type"] == "application/json"
    assert res.json() == {"error": "rate_limited", "dimension": "user", "retry_after": 1}
    assert res.headers["Retry-After"] == "1"
    assert res.headers["RateLimit-Policy"] == POLICY
    # user: denied, retry in just under 1 s; key and ip could pay, so their
    # t is the time until full: (5 - 2) / 0.5 = 6 s and (10 - 7) / 1 = 3 s,
    # a few ms less.
    assert res.headers["RateLimit"] == '"user";r=0;t=1, "key";r=2;t=6, "ip";r=7;t=3'
    assert (res.headers["X-RateLimit-Limit"], res.headers["X-RateLimit-Remaining"]) == ("3", "0")


def test_unlimited_routes_have_no_headers(make_client):
    res = make_client().get("/healthz")
    assert res.status_code == 200 and "RateLimit" not in res.headers
