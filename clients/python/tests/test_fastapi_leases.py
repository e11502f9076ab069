"""FastAPI: the concurrency rule. A slot is held until the last byte of the
response (a StreamingResponse's too), a client that goes away mid-stream
frees it at once, a denial is a 429 with the concurrent-requests policy,
through the dependency and the middleware."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections.abc import AsyncIterator
from typing import Any, Optional

import pytest
import redis.asyncio
from conftest import SLOW, Target, run
from fastapi import Depends, FastAPI
from fastapi.responses import StreamingResponse
from fastapi.testclient import TestClient
from starlette.requests import Request
from tbasgi import PeerFromHeader, read_then_disconnect
from tbservers import free_port

import redis_tokenbucket.asyncio as tb_asyncio
import redis_tokenbucket.fastapi
from redis_tokenbucket import Bucket, Concurrency
from redis_tokenbucket.fastapi import (
    QUOTA_EXCEEDED,
    ConcurrencyLimit,
    ConcurrencyMiddleware,
    ConcurrencyRule,
    RateLimit,
    Rule,
    api_key,
    hold_until_sent,
    install,
)

# A lease far longer than any test: only a release can free a slot in time.
STREAMS = Concurrency(1, 60_000, name="streams")
SLOTS = ConcurrencyRule(STREAMS, api_key())
KEY = Rule(Bucket(5, SLOW, name="key"), api_key())
TOKENS = 50


def make_app(port: int, how: str, rules: tuple[Rule, ...] = (), handlers: bool = True, **options: Any) -> FastAPI:
    """/v1/stream streams TOKENS server-sent events, slowly; /v1/fail
    raises; /v1/plain answers a dict. Each holds a slot of SLOTS, through
    the dependency or the middleware."""
    app = FastAPI()
    if handlers:
        install(app)
    limiter = tb_asyncio.Limiter(redis.asyncio.Redis(port=port))
    app.state.limiter = limiter
    if how == "middleware":
        app.add_middleware(ConcurrencyMiddleware, limiter=limiter, rule=SLOTS, rules=rules, **options)
        limited: list[Any] = []
    else:
        limited = [Depends(ConcurrencyLimit(limiter, SLOTS, *rules, **options))]

    @app.get("/v1/stream", dependencies=limited)
    async def stream() -> StreamingResponse:
        async def events() -> AsyncIterator[str]:
            for i in range(TOKENS):
                yield f"data: {i}\n\n"
                await asyncio.sleep(0.05)

        return StreamingResponse(events(), media_type="text/event-stream")

    @app.get("/v1/fail", dependencies=limited)
    async def fail() -> dict[str, str]:
        raise RuntimeError("the route failed")

    @app.get("/v1/plain", dependencies=limited)
    async def plain() -> dict[str, bool]:
        return {"ok": True}

    return app


def in_flight(target: Target, api_key_value: str = "k1") -> int:
    """The slots held for an API key, read from the lease hash (every lease
    of these tests lives 60 s, so every field is live)."""
    key = f"rl:streams:{hashlib.sha256(api_key_value.encode()).hexdigest()}"
    with target.admin() as admin:
        return sum(int(v.split(":")[1]) for v in admin.hvals(key))


@pytest.mark.parametrize("how", ["dependency", "middleware"])
def test_a_client_that_goes_away_mid_stream_frees_its_slot_at_once(target: Target, how: str):
    """The lease lives 60 s; the slot must be free as soon as the server
    reports the client gone, not when the lease expires."""

    async def main() -> list[Any]:
        app = make_app(target.server.port, how)
        limiter = app.state.limiter
        seen: list[Any] = []

        async def while_connected() -> None:
            seen.append(in_flight(target))
            # A second client finds no slot: 429.
            busy = await read_then_disconnect(app, "/v1/stream", {"X-API-Key": "k1"})
            seen.append(busy.status)

        streamed = await read_then_disconnect(app, "/v1/stream", {"X-API-Key": "k1"}, 3, while_connected)
        seen += [streamed.status, len(streamed.chunks), in_flight(target)]
        # The slot is someone else's to take now.
        again = await read_then_disconnect(app, "/v1/stream", {"X-API-Key": "k1"})
        seen.append(again.status)
        await asyncio.sleep(0.05)
        seen.append(in_flight(target))
        await limiter.aclose()
        return seen

    held, busy, status, chunks, after, again, last = run(main())
    assert (held, busy, status, chunks) == (1, 429, 200, 3)
    assert after == 0, "the slot outlived its client"
    assert (again, last) == (200, 0)


@pytest.mark.parametrize("how", ["dependency", "middleware"])
def test_the_slot_is_held_until_the_last_byte(module_target: Target, how: str):
    async def main() -> list[int]:
        app = make_app(module_target.server.port, how)
        held: list[int] = []

        async def before_the_last_chunk() -> None:
            held.append(in_flight(module_target))

        streamed = await read_then_disconnect(
            app, "/v1/stream", {"X-API-Key": "k1"}, TOKENS - 1, before_the_last_chunk, disconnect=False
        )
        await app.state.limiter.aclose()
        return [*held, len(streamed.chunks), in_flight(module_target)]

    assert run(main()) == [1, TOKENS, 0]
    app = make_app(module_target.server.port, how)
    with TestClient(PeerFromHeader(app)) as client:
        # A plain response, and a route that raises: their slots come back.
        assert client.get("/v1/plain", headers={"X-API-Key": "k1"}).status_code == 200
        assert in_flight(module_target) == 0
        with pytest.raises(RuntimeError, match="the route failed"):
            client.get("/v1/fail", headers={"X-API-Key": "k1"})
        assert in_flight(module_target) == 0
        # No API key: refused before anything is sent, never let through unlimited.
        missing = client.get("/v1/plain")
        assert missing.status_code == 400 and missing.json()["detail"] == "The streams key is missing."
        assert in_flight(module_target) == 0


def test_a_denial_is_a_429_with_the_concurrent_requests_policy(module_target: Target):
    async def main() -> list[Any]:
        app = make_app(module_target.server.port, "dependency", rules=(KEY,), legacy_headers=True)
        out: list[Any] = []

        async def while_connected() -> None:
            busy = await read_then_disconnect(app, "/v1/stream", {"X-API-Key": "k1"})
            out.append(busy)

        first = await read_then_disconnect(app, "/v1/stream", {"X-API-Key": "k1"}, 1, while_connected)
        await app.state.limiter.aclose()
        return [first, *out]

    first, busy = run(main())
    assert first.headers["ratelimit-policy"] == '"streams";q=1;qu="concurrent-requests", "key";q=5;w=5000'
    assert first.headers["ratelimit"] == '"streams";r=0, "key";r=4;t=1000'
    assert busy.status == 429
    assert busy.headers["content-type"] == "application/problem+json"
    assert busy.headers["retry-after"] == "60"
    assert busy.headers["ratelimit-policy"] == '"streams";q=1;qu="concurrent-requests", "key";q=5;w=5000'
    # The denied request charged nothing: the key bucket still shows 4.
    assert busy.headers["ratelimit"] == '"streams";r=0;t=60, "key";r=4;t=1000'
    assert (busy.headers["x-ratelimit-limit"], busy.headers["x-ratelimit-remaining"]) == ("1", "0")
    body = json.loads(b"".join(busy.chunks))
    assert body["type"] == QUOTA_EXCEEDED and body["status"] == 429
    assert body["violated-policies"] == ["streams"]


def test_the_fields_of_rate_limit_and_concurrency_dependencies_add_up(module_target: Target):
    app = FastAPI()
    install(app)
    limiter = tb_asyncio.Limiter(redis.asyncio.Redis(port=module_target.server.port))

    @app.get("/v1/both", dependencies=[Depends(RateLimit(limiter, KEY)), Depends(ConcurrencyLimit(limiter, SLOTS))])
    async def both() -> dict[str, bool]:
        return {"ok": True}

    with TestClient(app) as client:
        res = client.get("/v1/both", headers={"X-API-Key": "k1"})
    assert res.headers["RateLimit-Policy"] == '"key";q=5;w=5000, "streams";q=1;qu="concurrent-requests"'
    assert res.headers["RateLimit"] == '"key";r=4;t=1000, "streams";r=0'
    assert in_flight(module_target) == 0


def test_without_install_the_app_says_so_at_startup_and_takes_no_slot(
    module_target: Target, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
):
    """An app built inside the server's event loop (as uvicorn loads it)
    without install(app) is told once, before any request; each request
    that would hold a slot is then a 500 naming the fix, with no traceback
    and no slot taken. With install(app), nothing is said."""
    monkeypatch.setattr(redis_tokenbucket.fastapi, "_installed", False)
    monkeypatch.setattr(redis_tokenbucket.fastapi, "_told_uninstalled", False)
    port = module_target.server.port

    async def load(handlers: bool) -> FastAPI:
        app = make_app(port, "dependency", handlers=handlers)
        await asyncio.sleep(0)  # the server's next turn, before any request
        return app

    with caplog.at_level(logging.ERROR, logger="redis_tokenbucket"):
        app = asyncio.run(load(False))
    told = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(told) == 1 and "install(app) was not called" in told[0]
    with TestClient(app, raise_server_exceptions=True) as client:
        for _ in range(3):
            res = client.get("/v1/plain", headers={"X-API-Key": "k1"})
            assert res.status_code == 500
            assert "needs install(app)" in res.json()["detail"]["detail"]
    assert in_flight(module_target) == 0
    assert len([r for r in caplog.records if r.levelno == logging.ERROR]) == 1  # said once
    caplog.clear()
    monkeypatch.setattr(redis_tokenbucket.fastapi, "_told_uninstalled", False)
    with caplog.at_level(logging.ERROR, logger="redis_tokenbucket"):
        asyncio.run(load(True))
    assert not [r for r in caplog.records if r.levelno == logging.ERROR]


@pytest.mark.parametrize("policy", ["open", "closed"])
def test_redis_down(policy: str):
    app = make_app(free_port(), "middleware", on_error=policy)
    with TestClient(app) as client:
        res = client.get("/v1/plain", headers={"X-API-Key": "k1"})
    if policy == "open":
        assert res.status_code == 200 and "RateLimit" not in res.headers
    else:
        assert res.status_code == 503 and res.headers["Retry-After"] == "1"


def test_hold_until_sent_holds_a_lease_the_route_took(module_target: Target):
    """A route that acquires itself (buckets in the same call, say) hands
    the lease over; it is released after the last byte, then `then` runs."""
    app = FastAPI()
    install(app)
    limiter = tb_asyncio.Limiter(redis.asyncio.Redis(port=module_target.server.port))
    settled: list[Optional[int]] = []

    @app.get("/v1/own")
    async def own(request: Request) -> StreamingResponse:
        lease = await limiter.acquire("rl:streams:own", STREAMS)
        assert lease.acquired

        async def then() -> None:
            settled.append(await limiter.in_flight("rl:streams:own"))

        await hold_until_sent(request, limiter, lease, then)

        async def events() -> AsyncIterator[str]:
            for i in range(3):
                yield f"data: {i}\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    with TestClient(app) as client:
        assert client.get("/v1/own").text == "data: 0\n\ndata: 1\n\ndata: 2\n\n"
    assert settled == [0]  # released first, then `then`


@pytest.mark.parametrize("how", ["dependency", "middleware"])
def test_a_shadow_rule_beside_a_slot_is_charged_and_never_refuses(module_target: Target, how: str):
    trial = Rule(Bucket(1, SLOW, name="trial"), api_key(), shadow=True)
    app = make_app(module_target.server.port, how, rules=(KEY, trial))
    events: list[Any] = []
    app.state.limiter.on_decision = events.append
    with TestClient(app) as client:
        answers = [client.get("/v1/plain", headers={"X-API-Key": "k1"}) for _ in range(3)]
    assert [a.status_code for a in answers] == [200, 200, 200]
    # The shadow rule is not in the slot's decision, nor in the fields.
    assert answers[2].headers["ratelimit-policy"] == '"streams";q=1;qu="concurrent-requests", "key";q=5;w=5000'
    assert [e.op for e in events if e.policy == "streams,key"] == ["acquire"] * 3
    assert [e.outcome for e in events if e.policy == "trial"] == ["near_limit", "shadow_mode", "shadow_mode"]
