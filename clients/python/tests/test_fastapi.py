"""FastAPI: the dependency, the middleware, the key functions, the 429
problem answer, and the failure policy over HTTP."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any, Optional

import pytest
import redis.asyncio
from conftest import SLOW, Target
from fastapi import Depends, FastAPI, HTTPException, Request, Response
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from fastapi.testclient import TestClient
from starlette.requests import Request as StarletteRequest
from tbasgi import CLIENT_IP_CASES, TRUSTED_PROXIES, PeerFromHeader
from tbservers import free_port

import redis_tokenbucket.asyncio as tb_asyncio
from redis_tokenbucket import Bucket, Decision, MultiDecision, Quota
from redis_tokenbucket.fastapi import (
    QUOTA_EXCEEDED,
    RateLimit,
    RateLimitMiddleware,
    Rule,
    api_key,
    client_ip,
    install,
    user_id,
)

KEY = Rule(Bucket(2, SLOW, name="key"), api_key())
IP = Rule(Bucket(5, SLOW, name="ip"), client_ip())


@contextmanager
def serve(
    port: int,
    how: str,
    rules: list[Rule],
    handlers: bool = True,
    limiter_options: Optional[dict[str, Any]] = None,
    **options: Any,
) -> Iterator[TestClient]:
    """A started app whose /v1/models is limited by `rules`, through the
    dependency or the middleware; /healthz is never limited."""
    app = FastAPI()
    if handlers:
        install(app)
    limiter = tb_asyncio.Limiter(redis.asyncio.Redis(port=port), **(limiter_options or {}))
    if how == "middleware":
        app.add_middleware(
            RateLimitMiddleware,
            limiter=limiter,
            rules=rules,
            exempt=lambda r: r.url.path == "/healthz",
            **options,
        )
        limited: list[Any] = []
    else:
        limited = [Depends(RateLimit(limiter, *rules, **options))]

    @app.get("/v1/models", dependencies=limited)
    async def models() -> dict[str, list[str]]:
        return {"data": ["stub"]}

    @app.get("/healthz")
    async def healthz() -> dict[str, bool]:
        return {"ok": True}

    with TestClient(PeerFromHeader(app)) as client:
        yield client


@pytest.mark.parametrize("how", ["dependency", "middleware"])
def test_admitted_then_refused_with_a_problem(target: Target, how: str):
    with serve(target.server.port, how, [KEY, IP], legacy_headers=True) as client:
        ok = client.get("/v1/models", headers={"X-API-Key": "k1"})
        assert ok.status_code == 200 and ok.json() == {"data": ["stub"]}
        assert ok.headers["RateLimit-Policy"] == '"key";q=2;w=2000, "ip";q=5;w=5000'
        assert ok.headers["RateLimit"] == '"key";r=1;t=1000, "ip";r=4;t=1000'
        assert "Retry-After" not in ok.headers
        client.get("/v1/models", headers={"X-API-Key": "k1"})
        denied = client.get("/v1/models", headers={"X-API-Key": "k1"})
        assert denied.status_code == 429
        assert denied.headers["content-type"] == "application/problem+json"
        assert denied.headers["Retry-After"] == "1000"
        assert denied.headers["RateLimit"] == '"key";r=0;t=1000, "ip";r=3;t=2000'
        assert (denied.headers["X-RateLimit-Limit"], denied.headers["X-RateLimit-Remaining"]) == ("2", "0")
        body = denied.json()
        assert body["type"] == QUOTA_EXCEEDED and body["status"] == 429
        assert body["violated-policies"] == ["key"] and "title" in body
        # All or nothing: the denied request did not spend the IP bucket.
        other = client.get("/v1/models", headers={"X-API-Key": "k2"})
        assert other.headers["RateLimit"].endswith('"ip";r=2;t=3000')
        assert "RateLimit" not in client.get("/healthz").headers


def test_keys_in_redis(module_target: Target):
    optional_key = Rule(KEY.bucket, api_key(), optional=True)
    with serve(module_target.server.port, "middleware", [optional_key, IP]) as client:
        client.get("/v1/models", headers={"X-API-Key": "secret-key", "X-Test-Peer": "198.51.100.9"})
        # Anonymous: the optional key rule is skipped, the IP one still applies.
        anon = client.get("/v1/models", headers={"X-Test-Peer": "198.51.100.9"})
        assert anon.headers["RateLimit-Policy"] == '"ip";q=5;w=5000'
    with module_target.admin() as admin:
        keys = set(admin.keys("*"))
    digest = hashlib.sha256(b"secret-key").hexdigest()
    assert keys == {f"rl:key:{digest}", "rl:ip:198.51.100.9"}  # the raw key never reaches Redis


def test_without_the_handlers_fastapi_still_sends_429_and_the_fields(module_target: Target):
    with serve(module_target.server.port, "dependency", [KEY], handlers=False) as client:
        for _ in range(2):
            client.get("/v1/models", headers={"X-API-Key": "k"})
        denied = client.get("/v1/models", headers={"X-API-Key": "k"})
    assert denied.status_code == 429 and denied.headers["Retry-After"] == "1000"
    assert denied.json()["detail"]["violated-policies"] == ["key"]


@pytest.mark.parametrize("how", ["dependency", "middleware"])
def test_redis_down(how: str, caplog: pytest.LogCaptureFixture):
    port = free_port()
    with serve(port, how, [IP], on_error="closed") as client:
        res = client.get("/v1/models")
        assert res.status_code == 503 and res.headers["content-type"] == "application/problem+json"
        assert res.json()["status"] == 503 and res.headers["Retry-After"] == "1"
        assert "RateLimit" not in res.headers
    caplog.clear()
    with serve(port, how, [IP], on_error="open") as client:
        res = client.get("/v1/models")
        assert res.status_code == 200 and "RateLimit" not in res.headers
    assert any("fail-open" in r.getMessage() for r in caplog.records if r.levelno == logging.ERROR)


def test_user_rules_and_costs(module_target: Target):
    app = FastAPI()
    install(app)
    limiter = tb_asyncio.Limiter(redis.asyncio.Redis(port=module_target.server.port))

    async def authenticate(request: Request) -> None:
        request.state.user_id = request.headers.get("x-user")

    def by_size(request: Request) -> float:
        return float(request.query_params.get("n", "1"))

    per_user = RateLimit(limiter, Rule(Bucket(10, SLOW, name="user"), user_id(), cost=by_size))

    @app.get("/work", dependencies=[Depends(authenticate), Depends(per_user)])
    async def work() -> dict[str, bool]:
        return {"ok": True}

    with TestClient(app) as client:
        assert client.get("/work?n=4", headers={"x-user": "ann"}).headers["RateLimit"] == '"user";r=6;t=4000'
        assert client.get("/work?n=7", headers={"x-user": "ann"}).status_code == 429
        assert "RateLimit" not in client.get("/work").headers  # anonymous: no rule applies


def test_rules_need_names_and_sane_costs():
    with pytest.raises(ValueError, match="needs a name"):
        Rule(Bucket(1, 1), api_key())
    with pytest.raises(ValueError, match="cost must not exceed max"):
        Rule(Bucket(1, 1, name="x"), api_key(), cost=2)
    with pytest.raises(ValueError, match="at least one Rule"):
        RateLimit(tb_asyncio.Limiter(redis.asyncio.Redis()))


@pytest.mark.parametrize("peer, forwarded, expected", [*CLIENT_IP_CASES, ("testclient", "198.51.100.1", "testclient")])
def test_client_ip(peer: str, forwarded: Optional[str], expected: str):
    headers = [] if forwarded is None else [(b"x-forwarded-for", forwarded.encode())]
    request = StarletteRequest({"type": "http", "client": (peer, 1234), "headers": headers})
    assert client_ip(TRUSTED_PROXIES)(request) == expected
    # Without trusted proxies the header never counts.
    if forwarded:
        assert client_ip()(request) == client_ip()(StarletteRequest({**request.scope, "headers": []}))


def test_multiple_forwarded_headers_are_one_list():
    request = StarletteRequest(
        {
            "type": "http",
            "client": ("10.0.0.5", 1),
            "headers": [(b"x-forwarded-for", b"198.51.100.1"), (b"x-forwarded-for", b"10.1.1.1")],
        }
    )
    assert client_ip(TRUSTED_PROXIES)(request) == "198.51.100.1"


def response_routes(app: FastAPI, limit: Any) -> None:
    """Routes that answer in each way a FastAPI route can, all limited."""
    deps = [Depends(limit)]

    @app.get("/dict", dependencies=deps)
    async def as_dict() -> dict[str, bool]:
        return {"ok": True}

    @app.get("/json", dependencies=deps)
    async def as_json() -> JSONResponse:
        return JSONResponse({"ok": True}, headers={"X-Own": "kept"})

    @app.get("/stream", dependencies=deps)
    async def as_stream() -> StreamingResponse:
        async def chunks() -> AsyncIterator[bytes]:
            yield b"one,"
            yield b"two"

        return StreamingResponse(chunks(), media_type="text/plain")

    @app.get("/text", dependencies=deps)
    def as_text() -> PlainTextResponse:
        return PlainTextResponse("ok")

    @app.get("/missing", dependencies=deps)
    async def missing() -> None:
        raise HTTPException(404, "no such thing")


@pytest.mark.parametrize("path", ["/dict", "/json", "/stream", "/text", "/missing"])
def test_the_dependency_sets_the_fields_on_every_response(module_target: Target, path: str):
    app = FastAPI()
    install(app)
    limiter = tb_asyncio.Limiter(redis.asyncio.Redis(port=module_target.server.port))
    response_routes(app, RateLimit(limiter, KEY))
    with TestClient(app) as client:
        first = client.get(path, headers={"X-API-Key": "k"})
        assert first.headers["RateLimit"] == '"key";r=1;t=1000'
        assert first.headers["RateLimit-Policy"] == '"key";q=2;w=2000'
        if path == "/json":
            assert first.headers["X-Own"] == "kept"
        if path == "/stream":
            assert first.text == "one,two"
        # One copy of each field, and the denial's own on a denial.
        client.get(path, headers={"X-API-Key": "k"})
        denied = client.get(path, headers={"X-API-Key": "k"})
        assert denied.status_code == 429 and denied.headers.get_list("RateLimit") == ['"key";r=0;t=1000']


def test_without_install_the_fields_reach_only_what_fastapi_builds(
    module_target: Target, caplog: pytest.LogCaptureFixture
):
    """What install(app) is for: without it, FastAPI drops the fields of a
    Response a route returns itself; the dependency says so in the log."""
    app = FastAPI()
    limiter = tb_asyncio.Limiter(redis.asyncio.Redis(port=module_target.server.port))
    response_routes(app, RateLimit(limiter, KEY))
    with TestClient(app) as client:
        assert "RateLimit" in client.get("/dict", headers={"X-API-Key": "a"}).headers
        assert "RateLimit" not in client.get("/json", headers={"X-API-Key": "b"}).headers
    assert "without install(app)" in caplog.text


TIERS = {"free": Bucket(2, SLOW, name="user"), "pro": Bucket(5, SLOW, name="user")}


def tier_of(request: Request) -> Bucket:
    return TIERS[request.headers.get("x-tier", "free")]


async def tier_looked_up(request: Request) -> Bucket:
    return tier_of(request)


@pytest.mark.parametrize("bucket", [tier_of, tier_looked_up], ids=["sync", "async"])
def test_a_rule_takes_the_bucket_from_the_request(module_target: Target, bucket: Any):
    """The caller's tier picks the bucket; both tiers name it "user", so one
    key per user holds what was spent across a change of tier."""
    app = FastAPI()
    install(app)
    limiter = tb_asyncio.Limiter(redis.asyncio.Redis(port=module_target.server.port))
    per_user = RateLimit(limiter, Rule(bucket, lambda request: request.headers.get("x-user")))

    @app.get("/work", dependencies=[Depends(per_user)])
    async def work() -> dict[str, bool]:
        return {"ok": True}

    with TestClient(app) as client:
        free = client.get("/work", headers={"x-user": "ann"})
        assert free.headers["RateLimit-Policy"] == '"user";q=2;w=2000'
        assert free.headers["RateLimit"] == '"user";r=1;t=1000'
        # The 1 token left moves to the pro bucket: a higher max adds none.
        pro = client.get("/work", headers={"x-user": "ann", "x-tier": "pro"})
        assert pro.headers["RateLimit-Policy"] == '"user";q=5;w=5000'
        assert pro.headers["RateLimit"] == '"user";r=0;t=5000'
        assert client.get("/work", headers={"x-user": "ann"}).status_code == 429
    with module_target.admin() as admin:
        assert admin.keys("*") == ["rl:user:ann"]


def test_a_rules_bucket_function_must_return_a_named_bucket(module_target: Target):
    limiter = tb_asyncio.Limiter(redis.asyncio.Redis(port=module_target.server.port))
    app = FastAPI()

    async def ok() -> dict[str, bool]:
        return {"ok": True}

    for path, bucket in [("/tuple", lambda r: (10, 1)), ("/unnamed", lambda r: Bucket(10, 1))]:
        app.get(path, dependencies=[Depends(RateLimit(limiter, Rule(bucket, api_key())))])(ok)
    with TestClient(app, raise_server_exceptions=True) as client:
        with pytest.raises(TypeError, match="must return a Bucket or a Quota, got tuple"):
            client.get("/tuple", headers={"X-API-Key": "k"})
        with pytest.raises(ValueError, match="needs a name"):
            client.get("/unnamed", headers={"X-API-Key": "k"})
    with pytest.raises(TypeError, match="a Rule's bucket is a Bucket, a Quota or a function"):
        Rule((10, 1), api_key())  # type: ignore[arg-type]


class Shedding(tb_asyncio.Limiter):
    """Answers every consume_many as a limiter shedding load does."""

    async def consume_many(self, groups: Any, **options: Any) -> MultiDecision:
        decisions = tuple(Decision(False, 0, 0, 0, k, b, c, shed=True) for k, b, c in groups)
        return MultiDecision(False, 2500, decisions, shed=True)


@pytest.mark.parametrize("how", ["dependency", "middleware"])
def test_a_shed_call_is_a_503_with_retry_after(how: str):
    app = FastAPI()
    install(app)
    limiter = Shedding(redis.asyncio.Redis(port=free_port()))
    if how == "middleware":
        app.add_middleware(RateLimitMiddleware, limiter=limiter, rules=[IP])
        deps: list[Any] = []
    else:
        deps = [Depends(RateLimit(limiter, IP))]

    @app.get("/v1/models", dependencies=deps)
    async def models() -> dict[str, list[str]]:
        return {"data": []}

    with TestClient(app) as client:
        res = client.get("/v1/models")
    assert res.status_code == 503 and res.headers["Retry-After"] == "3"
    assert res.json()["detail"] == "The server is overloaded."
    assert "RateLimit" not in res.headers


@contextmanager
def paced_app(port: int, how: str, rules: list[Rule], max_delay: float) -> Iterator[tuple[TestClient, list[float]]]:
    """/v1/models limited by `rules` with `max_delay`; the limiter's sleeps
    are recorded (and still slept)."""
    app = FastAPI()
    install(app)
    limiter = tb_asyncio.Limiter(redis.asyncio.Redis(port=port))
    slept: list[float] = []
    sleep = limiter.sleep

    async def recorded(seconds: float) -> None:
        slept.append(seconds)
        await sleep(seconds)

    limiter.sleep = recorded  # type: ignore[method-assign]
    limited: list[Any] = []
    if how == "middleware":
        app.add_middleware(RateLimitMiddleware, limiter=limiter, rules=rules, max_delay=max_delay)
    else:
        limited = [Depends(RateLimit(limiter, *rules, max_delay=max_delay))]

    @app.get("/v1/models", dependencies=limited)
    async def models() -> dict[str, list[str]]:
        return {"data": ["stub"]}

    with TestClient(PeerFromHeader(app)) as client:
        yield client, slept


@pytest.mark.parametrize("how", ["dependency", "middleware"])
def test_a_request_over_the_burst_waits_within_max_delay(module_target: Target, how: str) -> None:
    # A burst of 1, a token each 100 ms: each request after the first waits
    # its turn, up to 100 ms, and passes.
    rule = Rule(Bucket(1, 10, name="paced"), api_key())
    with paced_app(module_target.server.port, how, [rule], max_delay=0.15) as (client, slept):
        statuses = [client.get("/v1/models", headers={"X-API-Key": "k"}).status_code for _ in range(3)]
        assert statuses == [200, 200, 200]
        assert len(slept) == 2 and all(0.05 < s <= 0.1 for s in slept), slept
    # A wait longer than max_delay is a refusal, as without it.
    rule = Rule(Bucket(1, 10, name="strict"), api_key())
    with paced_app(module_target.server.port, how, [rule], max_delay=0.05) as (client, slept):
        statuses = [client.get("/v1/models", headers={"X-API-Key": "k"}).status_code for _ in range(2)]
        assert statuses == [200, 429] and slept == []


@pytest.mark.parametrize("how", ["dependency", "middleware"])
def test_a_quota_rule_refuses_past_its_limit_and_names_its_period(module_target: Target, how: str) -> None:
    rule = Rule(Quota(2, "day", name="daily"), api_key())
    with paced_app(module_target.server.port, how, [rule], max_delay=1) as (client, slept):
        ok = client.get("/v1/models", headers={"X-API-Key": "k"})
        assert ok.status_code == 200
        assert ok.headers["RateLimit-Policy"] == '"daily";q=2;w=86400'
        client.get("/v1/models", headers={"X-API-Key": "k"})
        denied = client.get("/v1/models", headers={"X-API-Key": "k"})
        # A quota never reserves: past its limit, the wait is until the reset.
        assert denied.status_code == 429 and slept == []
        assert 0 < int(denied.headers["Retry-After"]) <= 86400


@pytest.mark.parametrize("how", ["dependency", "middleware"])
def test_a_missing_identity_is_a_400_unless_the_rule_is_optional_or_falls_back(module_target: Target, how: str):
    # Leaving out X-API-Key must not escape the per-key limit.
    with serve(module_target.server.port, how, [KEY, IP]) as client:
        missing = client.get("/v1/models", headers={"X-Test-Peer": "198.51.100.9"})
        assert missing.status_code == 400 and missing.headers["content-type"] == "application/problem+json"
        assert missing.json()["detail"] == "The key key is missing."
        assert "RateLimit" not in missing.headers
    with module_target.admin() as admin:
        assert admin.keys("*") == []  # refused before anything was sent
    # A fallback identity: callers without a key are limited by their address.
    keyed_or_ip = Rule(Bucket(1, SLOW, name="caller"), api_key(), fallback=client_ip())
    with serve(module_target.server.port, how, [keyed_or_ip]) as client:
        first = client.get("/v1/models", headers={"X-Test-Peer": "198.51.100.7"})
        second = client.get("/v1/models", headers={"X-Test-Peer": "198.51.100.7"})
        assert (first.status_code, second.status_code) == (200, 429)
    with module_target.admin() as admin:
        assert admin.keys("rl:caller:*") == ["rl:caller:198.51.100.7"]
    # Optional and every rule skipped: admitted, no fields, the skip visible.
    seen: list[Any] = []
    app = FastAPI()
    install(app)
    limiter = tb_asyncio.Limiter(redis.asyncio.Redis(port=module_target.server.port))
    limit = RateLimit(limiter, Rule(Bucket(1, SLOW, name="anon"), api_key(), optional=True))

    @app.get("/v1/models")
    async def models(request: Request, response: Response) -> dict[str, bool]:
        seen.append(await limit(request, response))
        return {"ok": True}

    with TestClient(app) as client:
        ok = client.get("/v1/models")
        assert ok.status_code == 200 and "RateLimit-Policy" not in ok.headers
    assert seen[0].allowed and seen[0].decisions == () and seen[0].skipped == ("anon",)


@pytest.mark.parametrize("how", ["dependency", "middleware"])
def test_a_shadow_rule_is_charged_beside_and_never_refuses(
    module_target: Target, how: str, caplog: pytest.LogCaptureFixture
):
    trial = Rule(Bucket(1, SLOW, name="trial"), api_key(), shadow=True)
    events: list[Any] = []
    caplog.set_level(logging.INFO, logger="redis_tokenbucket")
    options = {"on_decision": events.append}
    with serve(module_target.server.port, how, [KEY, trial], limiter_options=options) as client:
        statuses = [client.get("/v1/models", headers={"X-API-Key": "k1"}) for _ in range(3)]
        # Without the key the enforced rule refuses; the shadow one is skipped.
        missing = client.get("/v1/models")
    assert [r.status_code for r in statuses] == [200, 200, 429]
    # The shadow rule puts no fields on the response and names no policy.
    assert statuses[1].headers["RateLimit-Policy"] == '"key";q=2;w=2000'
    assert statuses[2].json()["violated-policies"] == ["key"]
    assert missing.status_code == 400
    # Its denial did not stop the enforced charge (the third is refused by
    # `key`), and it was counted for every request, the refused one too.
    by_rule = {name: [e.outcome for e in events if e.policy == name] for name in ("key", "trial")}
    assert by_rule == {
        "key": ["within_limit", "near_limit", "over_limit"],
        "trial": ["near_limit", "shadow_mode", "shadow_mode"],
    }
    assert all(e.allowed for e in events if e.policy == "trial")
    assert "shadow mode let through a request trial would deny" in caplog.text


@pytest.mark.parametrize("how", ["dependency", "middleware"])
def test_a_shadow_limiter_answers_200_past_the_limit(module_target: Target, how: str):
    events: list[Any] = []
    options = {"on_decision": events.append, "shadow": True}
    with serve(module_target.server.port, how, [KEY], limiter_options=options) as client:
        statuses = [client.get("/v1/models", headers={"X-API-Key": "k1"}).status_code for _ in range(3)]
    assert statuses == [200, 200, 200]
    assert [(e.outcome, e.rule, e.allowed) for e in events] == [
        ("within_limit", "key", True),
        ("near_limit", "key", True),
        ("shadow_mode", "key", True),
    ]
