"""FastAPI: a rule's penalty (`block`), a rule that always denies (Deny),
and trusted callers who skip a rule (`skip`)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import redis.asyncio
from conftest import Target
from fastapi import FastAPI, Request, Response
from fastapi.testclient import TestClient
from tbasgi import PeerFromHeader

import redis_tokenbucket.asyncio as tb_asyncio
from redis_tokenbucket import Bucket, InvalidArgument, Quota
from redis_tokenbucket.fastapi import (
    QUOTA_EXCEEDED,
    Deny,
    RateLimit,
    RateLimitMiddleware,
    Rule,
    api_key,
    client_ip,
    install,
)

# 1 token, refilled at 0.01/s: a denial at an empty bucket waits 100 s.
TINY = Bucket(1, 0.01, name="key")


@contextmanager
def serve(port: int, how: str, rules: list[Rule], seen: list[Any]) -> Iterator[TestClient]:
    app = FastAPI()
    install(app)
    limiter = tb_asyncio.Limiter(redis.asyncio.Redis(port=port))
    if how == "middleware":
        app.add_middleware(RateLimitMiddleware, limiter=limiter, rules=rules)

        @app.get("/v1/models")
        async def models_mw() -> dict[str, bool]:
            return {"ok": True}

    else:
        limit = RateLimit(limiter, *rules)

        @app.get("/v1/models")
        async def models(request: Request, response: Response) -> dict[str, bool]:
            seen.append(await limit(request, response))
            return {"ok": True}

    with TestClient(PeerFromHeader(app)) as client:
        yield client


def tokens(target: Target, key: str) -> float:
    with target.admin() as admin:
        return float(admin.hget(key, "tokens"))


@pytest.mark.parametrize("how", ["dependency", "middleware"])
def test_a_denial_is_blocked_for_the_rules_block_once(module_target: Target, how: str) -> None:
    rule = Rule(TINY, api_key(), block=150)
    with serve(module_target.server.port, how, [rule], []) as client:
        headers = {"X-API-Key": "k1"}
        assert client.get("/v1/models", headers=headers).status_code == 200
        key = next(iter(module_target.admin().keys("rl:key:*")))
        assert tokens(module_target, key) < 0.01  # the admitted call paid its token, no penalty
        denied = client.get("/v1/models", headers=headers)
        assert denied.status_code == 429 and denied.json()["type"] == QUOTA_EXCEEDED
        # The wait was 100 s; the penalty makes it 150 s: 0.5 token of debt.
        assert denied.headers["Retry-After"] == "150"
        assert -0.51 < tokens(module_target, key) < -0.49
        # Denied again inside the block: the bucket in debt, nothing more charged.
        again = client.get("/v1/models", headers=headers)
        assert again.status_code == 429 and int(again.headers["Retry-After"]) <= 150
        assert -0.51 < tokens(module_target, key) < -0.49


def test_a_block_past_what_the_floor_holds_is_refused_when_the_rule_is_built() -> None:
    # From -max to a cost of 1: (1 + 1) / 0.01 = 200 s.
    Rule(TINY, api_key(), block=200)
    with pytest.raises(InvalidArgument, match=r"block 201 s .* = 200 s") as raised:
        Rule(TINY, api_key(), block=201)
    assert raised.value.field == "block"
    with pytest.raises(InvalidArgument, match="block must be > 0"):
        Rule(TINY, api_key(), block=0)
    with pytest.raises(InvalidArgument, match="block needs a Bucket"):
        Rule(Quota(5, "day", name="daily"), api_key(), block=10)
    with pytest.raises(ValueError, match="Deny rule"):
        Rule(Deny("banned"), api_key(), block=10)


@pytest.mark.parametrize("how", ["dependency", "middleware"])
def test_a_deny_rule_refuses_without_calling_redis(module_target: Target, how: str) -> None:
    rules = [Rule(Deny("banned"), client_ip(), skip={"198.51.100.9"}), Rule(TINY, api_key(), optional=True)]
    with serve(module_target.server.port, how, rules, []) as client:
        denied = client.get("/v1/models", headers={"X-Test-Peer": "198.51.100.7", "X-API-Key": "k1"})
        assert denied.status_code == 429 and denied.headers["content-type"] == "application/problem+json"
        assert denied.headers["Retry-After"] == "3600"
        assert denied.headers["RateLimit-Policy"] == '"banned";q=0'
        assert denied.headers["RateLimit"] == '"banned";r=0;t=3600'
        assert denied.json()["violated-policies"] == ["banned"]
        assert module_target.admin().keys("*") == []  # nothing was sent
        # The trusted address skips the Deny rule; the other rule still applies.
        ok = client.get("/v1/models", headers={"X-Test-Peer": "198.51.100.9", "X-API-Key": "k1"})
        assert ok.status_code == 200 and ok.headers["RateLimit-Policy"].startswith('"key";q=1')
    with pytest.raises(ValueError, match="retry_after"):
        Deny("banned", retry_after=0)


def test_a_trusted_caller_skips_the_rule_and_is_named_in_skipped(module_target: Target) -> None:
    async def trusted(request: Request) -> bool:
        return request.headers.get("X-API-Key") == "internal"

    seen: list[Any] = []
    with serve(module_target.server.port, "dependency", [Rule(TINY, api_key(), skip=trusted)], seen) as client:
        for _ in range(3):
            assert client.get("/v1/models", headers={"X-API-Key": "internal"}).status_code == 200
        assert module_target.admin().keys("*") == []  # skipped before anything was sent
        assert seen[0].skipped == ("key",) and seen[0].decisions == ()
        assert client.get("/v1/models", headers={"X-API-Key": "k1"}).status_code == 200
        assert client.get("/v1/models", headers={"X-API-Key": "k1"}).status_code == 429
    with pytest.raises(TypeError, match="skip"):
        Rule(TINY, api_key(), skip=["internal"])  # type: ignore[arg-type]
