"""FastAPI: the dependency, the middleware, the key functions, the 429
problem answer, and the failure policy over HTTP."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Optional

import pytest
import redis.asyncio
from conftest import SLOW, Target
from fastapi import Depends, FastAPI, Request
from fastapi.testclient import TestClient
from starlette.requests import Request as StarletteRequest
from tbasgi import CLIENT_IP_CASES, TRUSTED_PROXIES, PeerFromHeader
from tbservers import free_port

import redis_tokenbucket.asyncio as tb_asyncio
from redis_tokenbucket import Bucket
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
def serve(port: int, how: str, rules: list[Rule], handlers: bool = True, **options: Any) -> Iterator[TestClient]:
    """A started app whose /v1/models is limited by `rules`, through the
    dependency or the middleware; /healthz is never limited."""
    app = FastAPI()
    if handlers:
        install(app)
    limiter = tb_asyncio.Limiter(redis.asyncio.Redis(port=port))
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
    with serve(module_target.server.port, "middleware", [KEY, IP]) as client:
        client.get("/v1/models", headers={"X-API-Key": "secret-key", "X-Test-Peer": "198.51.100.9"})
        # Anonymous: the key rule is skipped, the IP one still applies.
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
        assert res.json()["status"] == 503
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
