"""Several limiters on one app, and one that can't decide (the
Python side): failing closed is an honest 503, rules with other limits
never share Redis keys unless asked to, and stacked limiters each put
their policy in the RateLimit lists."""

from __future__ import annotations

from typing import Any

import pytest
import redis.asyncio
from conftest import SLOW, Target
from fastapi import Depends, FastAPI, Request
from fastapi.testclient import TestClient
from tbservers import free_port

import redis_tokenbucket.asyncio as tb_asyncio
from redis_tokenbucket import Bucket, Concurrency, Decision, Lease, MultiDecision
from redis_tokenbucket.fastapi import (
    ConcurrencyLimit,
    ConcurrencyMiddleware,
    ConcurrencyRule,
    RateLimit,
    RateLimitMiddleware,
    Rule,
    api_key,
    install,
    problem_response,
)

# ---- failing closed: a 503 with Retry-After, never a 429 "retry now" --------------


def test_problem_response_to_a_denial_nothing_counted_is_a_503():
    """A denial by the failure policy ("closed") or a shed one has no wait
    a bucket set: the package's own answer for it is a 503 with
    Retry-After >= 1, as RateLimit's and ConcurrencyLimit's are."""
    bucket = Bucket(5, SLOW, name="ip")
    closed = MultiDecision(False, 0, (Decision(False, 0, 0, 0, "rl:ip:a", bucket, 1, degraded=True),), degraded=True)
    lease = Lease(False, 0, 0, 0, "id", "rl:streams:a", Concurrency(2, 1000, name="streams"), 1, (), degraded=True)
    for decision in (closed, lease):
        res = problem_response(decision)
        assert res.status_code == 503 and int(res.headers["Retry-After"]) >= 1, decision
        assert "RateLimit" not in res.headers
    # A bucket's denial is still a 429 with its own wait.
    counted = MultiDecision(False, 6000, (Decision(False, 0, 6000, 6000, "rl:ip:a", bucket, 1),))
    res = problem_response(counted)
    assert res.status_code == 429 and res.headers["Retry-After"] == "6"


def test_a_limiter_failing_closed_through_problem_response():
    """Redis unreachable, on_error="closed": the decision goes to the
    problem answer as a route that limits itself would hand it over."""
    limiter = tb_asyncio.Limiter(redis.asyncio.Redis(port=free_port()), on_error="closed")
    app = FastAPI()

    @app.get("/v1/models")
    async def models(request: Request) -> Any:
        decision = await limiter.consume_many([("rl:ip:a", Bucket(5, SLOW, name="ip"))])
        return {"data": []} if decision.allowed else problem_response(decision)

    with TestClient(app) as client:
        res = client.get("/v1/models")
    assert res.status_code == 503 and res.headers["Retry-After"] == "1"


# ---- rules with other limits never share keys --------------------------------------

GLOBAL_IP = Rule(Bucket.parse("100/minute", name="ip"), lambda request: "198.51.100.7")
LOGIN_IP = Rule(Bucket.parse("2/minute", name="ip"), lambda request: "198.51.100.7")


def test_two_rules_with_other_limits_on_one_key_are_refused_at_construction():
    limiter = tb_asyncio.Limiter(redis.asyncio.Redis(port=free_port()))
    RateLimit(limiter, GLOBAL_IP)
    with pytest.raises(ValueError, match=r"rl:ip:<identity>.*Bucket\(max=100, .*Bucket\(max=2, "):
        RateLimit(limiter, LOGIN_IP)
    with pytest.raises(ValueError, match="rl:ip:<identity>"):
        RateLimitMiddleware(FastAPI(), limiter, [LOGIN_IP])
    # A lease on the same key as a bucket would be a WRONGTYPE on every call.
    with pytest.raises(ValueError, match="rl:ip:<identity>"):
        ConcurrencyLimit(limiter, ConcurrencyRule(Concurrency(2, 1000, name="ip"), api_key()))
    # The same limits in two places: one policy, one bucket, as asked.
    RateLimit(limiter, Rule(Bucket.parse("100/minute", name="ip"), api_key()))
    # Another limiter is another set of keys' owners.
    RateLimit(tb_asyncio.Limiter(redis.asyncio.Redis(port=free_port())), LOGIN_IP)


def test_a_login_limit_with_its_own_prefix_leaves_the_global_one_alone(module_target: Target):
    limiter = tb_asyncio.Limiter(module_target.async_client())
    login = Rule(Bucket.parse("2/minute", name="ip"), lambda request: "198.51.100.7", prefix="rl:login")
    app = FastAPI()
    install(app)

    @app.post("/login", dependencies=[Depends(RateLimit(limiter, GLOBAL_IP, login))])
    async def log_in() -> dict[str, bool]:
        return {"ok": True}

    @app.get("/v1/models", dependencies=[Depends(RateLimit(limiter, GLOBAL_IP))])
    async def models() -> dict[str, list[str]]:
        return {"data": []}

    with TestClient(app) as client:
        assert [client.post("/login").status_code for _ in range(3)] == [200, 200, 429]
        assert client.get("/v1/models").status_code == 200
    with module_target.admin() as admin:
        assert sorted(admin.keys("*")) == ["rl:ip:198.51.100.7", "rl:login:ip:198.51.100.7"]


def test_a_rule_whose_bucket_is_a_function_claims_its_key_on_first_use(module_target: Target):
    """The tier function's buckets may differ in size (it asks for that);
    another rule on the same key is refused, whichever comes first."""

    def tiers() -> Rule:
        return Rule(lambda request: Bucket(10 if request.headers.get("x-tier") else 2, SLOW, name="user"), api_key())

    def app_with(*limits: RateLimit) -> FastAPI:
        app = FastAPI()
        install(app)
        for i, limit in enumerate(limits):
            app.get(f"/{i}", dependencies=[Depends(limit)])(_ok)
        return app

    limiter = tb_asyncio.Limiter(module_target.async_client())
    with TestClient(app_with(RateLimit(limiter, tiers()))) as client:
        assert client.get("/0", headers={"X-API-Key": "k"}).status_code == 200
        assert client.get("/0", headers={"X-API-Key": "k", "x-tier": "pro"}).status_code == 200
    with pytest.raises(ValueError, match=r"rl:user:<identity>.*a function of the request"):
        RateLimit(limiter, Rule(Bucket(5, SLOW, name="user"), api_key()))

    limiter = tb_asyncio.Limiter(module_target.async_client())
    app = app_with(RateLimit(limiter, Rule(Bucket(5, SLOW, name="user"), api_key())), RateLimit(limiter, tiers()))
    with TestClient(app, raise_server_exceptions=True) as client:
        assert client.get("/0", headers={"X-API-Key": "k2"}).status_code == 200
        with pytest.raises(ValueError, match="rl:user:<identity>"):
            client.get("/1", headers={"X-API-Key": "k2"})


async def _ok() -> dict[str, bool]:
    return {"ok": True}


# ---- stacked limiters: every policy that applied, in the lists ---------------------

IP = Rule(Bucket(600, SLOW, name="ip"), lambda request: "198.51.100.7")
STRICT = Rule(Bucket(2, SLOW, name="strict"), api_key())
STREAMS = ConcurrencyRule(Concurrency(8, 30_000, name="streams"), api_key())


def stacked_app(port: int, order: str) -> FastAPI:
    limiter = tb_asyncio.Limiter(redis.asyncio.Redis(port=port))
    app = FastAPI()
    if order == "middleware-outside":
        install(app)
        app.add_middleware(RateLimitMiddleware, limiter=limiter, rules=[IP], legacy_headers=True)
    else:
        app.add_middleware(RateLimitMiddleware, limiter=limiter, rules=[IP], legacy_headers=True)
        install(app)
    app.get("/v1/models", dependencies=[Depends(RateLimit(limiter, STRICT, legacy_headers=True))])(_ok)
    return app


@pytest.mark.parametrize("order", ["middleware-outside", "middleware-inside"])
def test_a_middleware_and_a_dependency_both_send_their_policy(module_target: Target, order: str):
    with TestClient(stacked_app(module_target.server.port, order)) as client:
        ok = client.get("/v1/models", headers={"X-API-Key": "k"})
        client.get("/v1/models", headers={"X-API-Key": "k"})
        denied = client.get("/v1/models", headers={"X-API-Key": "k"})
    assert ok.status_code == 200
    assert sorted(ok.headers["RateLimit-Policy"].split(", ")) == ['"ip";q=600;w=600000', '"strict";q=2;w=2000']
    assert sorted(ok.headers["RateLimit"].split(", ")) == ['"ip";r=599;t=1000', '"strict";r=1;t=1000']
    # The legacy pair: the policy with the fewest left.
    assert (ok.headers["X-RateLimit-Limit"], ok.headers["X-RateLimit-Remaining"]) == ("2", "1")
    # Denied by the dependency, admitted by the middleware: both still say so.
    assert denied.status_code == 429 and denied.headers["Retry-After"] == "1000"
    assert sorted(denied.headers["RateLimit"].split(", ")) == ['"ip";r=597;t=3000', '"strict";r=0;t=1000']


def test_a_concurrency_middleware_under_a_rate_limit_middleware(module_target: Target):
    limiter = tb_asyncio.Limiter(redis.asyncio.Redis(port=module_target.server.port))
    app = FastAPI()
    app.add_middleware(ConcurrencyMiddleware, limiter=limiter, rule=STREAMS)
    app.add_middleware(RateLimitMiddleware, limiter=limiter, rules=[IP])
    app.get("/v1/models")(_ok)
    with TestClient(app) as client:
        ok = client.get("/v1/models", headers={"X-API-Key": "k"})
    assert ok.status_code == 200
    policies = ok.headers["RateLimit-Policy"].split(", ")
    assert sorted(policies) == ['"ip";q=600;w=600000', '"streams";q=8;qu="concurrent-requests"']
    assert sorted(ok.headers["RateLimit"].split(", ")) == ['"ip";r=599;t=1000', '"streams";r=7']
