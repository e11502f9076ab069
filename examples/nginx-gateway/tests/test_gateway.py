"""The FastAPI example's answers, from nginx: tiers, one TB.MCONSUME per
request, 429/401/413, the fields, reserve and settle, fail open and fail
closed, /readyz."""

from __future__ import annotations

import time

from conftest import auth, key_id


def test_capacity_then_one_429_as_the_fastapi_gateway_answers(server, r, gateway):
    g = gateway()
    codes = [g.request("GET", "/v1/models", auth("k-free")) for _ in range(4)]
    assert [c.status for c in codes] == [200, 200, 200, 429]
    assert codes[0].json() == {"data": [{"id": "stub-echo"}]}
    assert codes[0].headers["ratelimit-policy"] == '"user";q=3;w=3000, "key";q=5;w=5000, "ip";q=50;w=50000'
    assert codes[0].headers["ratelimit"] == '"user";r=2;t=1000, "key";r=4;t=1000, "ip";r=49;t=1000'
    assert codes[0].headers["x-ratelimit-limit"] == "3" and codes[0].headers["x-ratelimit-remaining"] == "2"
    denied = codes[3]
    assert denied.json() == {"error": "rate_limited", "dimension": "user", "retry_after": 1000}
    assert denied.headers["retry-after"] == "1000"
    assert denied.headers["ratelimit"].startswith('"user";r=0;t=1000, "key";r=2;')


def test_the_same_redis_keys_as_the_fastapi_gateway(server, r, gateway):
    g = gateway()
    g.request("GET", "/v1/models", auth("k-std"))
    assert sorted(r.keys("rl:*")) == sorted(
        [b"rl:user:u-std", f"rl:key:{key_id('k-std')}".encode(), b"rl:ip:127.0.0.1"]
    )


def test_unknown_tiers_get_free_and_unauthenticated_requests_pay_their_ip(server, r, gateway):
    g = gateway()
    assert [g.request("GET", "/v1/models", auth("k-gold")).status for _ in range(4)] == [200, 200, 200, 429]
    res = g.request("GET", "/v1/models")
    assert res.status == 401 and res.json() == {"error": "unauthorized", "detail": "missing or unknown X-API-Key"}
    assert g.request("GET", "/v1/models", auth("nope")).status == 401
    # 3 admitted for k-gold (its denial charged nothing), 1 without a key, 1 with a
    # wrong one: the IP paid for each.
    assert int(float(r.hget("rl:ip:127.0.0.1", "tokens"))) == 50 - 5


def test_a_key_header_no_key_can_be_is_a_400_with_nothing_written(server, r, gateway):
    g = gateway()
    for value in ("ab\x01cd", "a" * 2000):
        res = g.request("GET", "/v1/models", {"X-API-Key": value})
        assert res.status == 400 and res.json() == {"error": "bad_request", "detail": "X-API-Key is not a valid key"}
    assert r.dbsize() == 0


def test_a_chat_reserves_then_settles_the_unused_part(server, r, gateway):
    g = gateway()
    res = g.request("POST", "/v1/chat", auth("k-free"), {"prompt": "a b c d", "max_tokens": 10})
    assert res.status == 200
    usage = {"prompt_tokens": 4, "completion_tokens": 4, "reserved_tokens": 14}
    assert res.json() == {"text": "d c b a", "usage": usage}
    assert '"llm";r=86;' in res.headers["ratelimit"], "the reservation, as charged"
    deadline = time.monotonic() + 2
    while int(float(r.hget("rl:llm:user:u-free", "tokens") or 0)) != 92 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert int(float(r.hget("rl:llm:user:u-free", "tokens"))) == 100 - 8
    same = g.request("POST", "/v1/chat/completions", auth("k-free"), {"prompt": "a b", "max_tokens": 1})
    assert same.status == 200 and same.json()["text"] == "b"


def test_chats_the_budget_can_never_pay_or_that_are_malformed(server, r, gateway):
    g = gateway()
    res = g.request("POST", "/v1/chat", auth("k-free"), {"prompt": "a b", "max_tokens": 99})
    assert res.status == 413 and res.json() == {"error": "over_budget", "detail": "101 tokens exceed the budget of 100"}
    assert g.request("POST", "/v1/chat", auth("k-free"), {"prompt": "", "max_tokens": 1}).status == 422
    assert g.request("POST", "/v1/chat", auth("k-free"), b"not json").status == 422
    assert r.dbsize() == 0


def test_readyz_names_the_backend(server, r, gateway):
    g = gateway()
    res = g.request("GET", "/readyz")
    assert res.status == 200 and res.json() == {"ready": True, "backend": server.backend, "breaker": "closed"}
    assert g.request("GET", "/healthz").json() == {"ok": True}


def test_fail_open_and_fail_closed_when_redis_is_gone(gateway):
    g = gateway("redis://127.0.0.1:1/0", breaker_cooldown=30)
    for _ in range(6):
        res = g.request("GET", "/v1/models", auth("k-free"))
        assert res.status == 200 and "ratelimit" not in res.headers
    res = g.request("POST", "/v1/chat", auth("k-free"), {"prompt": "a", "max_tokens": 1})
    assert res.status == 503 and res.json() == {"error": "rate_limiter_unavailable"}
    assert res.headers["retry-after"] == "1"
    ready = g.request("GET", "/readyz")
    assert ready.status == 503 and ready.json()["ready"] is False
