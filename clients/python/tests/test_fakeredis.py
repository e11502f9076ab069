"""Tests without a server: fakeredis runs the package's own Lua library (it
has FUNCTION LOAD and FCALL, through lupa's Lua 5.1), so an application's
tests can use `Limiter(fakeredis.FakeRedis())`, or the asyncio twin, and get
the answers a real server gives."""

from __future__ import annotations

import time
from typing import Any

import fakeredis
import pytest
from conftest import Target, run
from fastapi import Depends, FastAPI
from fastapi.testclient import TestClient
from test_differential import SCENARIO, Reply, assert_same, normal, run_sync, steps

import redis_tokenbucket.asyncio as tb_asyncio
from redis_tokenbucket import Bucket, DenialCache, Limiter
from redis_tokenbucket._scripts import library_version
from redis_tokenbucket.fastapi import RateLimit, Rule, api_key, install

B = Bucket(3, 0.001, name="user")


def test_sync_limiter_on_fakeredis():
    r = fakeredis.FakeRedis()
    lim = Limiter(r, denial_cache=True)
    assert [lim.consume("rl:u", B).allowed for _ in range(4)] == [True, True, True, False]
    assert lim.backend == "functions"
    assert lim.consume("rl:u", B).cached
    assert lim.reset("rl:u") and lim.consume("rl:u", B).remaining == 2
    # The package's library, loaded and checked as on a server.
    assert r.execute_command("FCALL_RO", "tb_version", 0) == library_version().encode()


def test_asyncio_limiter_on_fakeredis():
    async def main() -> list[int]:
        lim = tb_asyncio.Limiter(fakeredis.FakeAsyncRedis())
        m = await lim.consume_many([("rl:{u}:a", B, 2), ("rl:{u}:b", B, 1)])
        d = await lim.adjust("rl:{u}:a", B, 1)
        return [*(x.remaining for x in m.decisions), d.remaining]

    assert run(main()) == [1, 2, 2]


def test_a_fakeredis_of_the_other_kind_is_refused():
    with pytest.raises(TypeError, match="needs a blocking client"):
        Limiter(fakeredis.FakeAsyncRedis())
    with pytest.raises(TypeError, match="needs an asyncio client"):
        tb_asyncio.Limiter(fakeredis.FakeRedis())


@pytest.mark.parametrize("mode", ["sync", "asyncio"])
def test_fakeredis_answers_like_the_module(module_target: Target, mode: str):
    reference, ref_took = run_sync(Limiter(module_target.client()), "ref:")
    if mode == "sync":
        replies, took = run_sync(Limiter(fakeredis.FakeRedis()), "t:")
    else:

        async def main() -> tuple[list[Reply], float]:
            lim = tb_asyncio.Limiter(fakeredis.FakeAsyncRedis())
            start = time.monotonic()
            out = [normal(await getattr(lim, op)(*args)) for op, args in steps("t:")]
            return out, (time.monotonic() - start) * 1000

        replies, took = run(main())
    for i, (a, b) in enumerate(zip(reference, replies, strict=True)):
        assert_same(a, b, ref_took + took + 1, f"step {i} {SCENARIO[i][0]}")


def make_app(limiter: tb_asyncio.Limiter) -> FastAPI:
    """An application as its tests would build it, with the limiter given."""
    app = FastAPI()
    install(app)
    limit = RateLimit(limiter, Rule(Bucket(2, 0.001, name="key"), api_key()))

    @app.get("/v1/models", dependencies=[Depends(limit)])
    async def models() -> dict[str, Any]:
        return {"data": []}

    return app


def test_a_fastapi_app_tested_without_a_server():
    app = make_app(tb_asyncio.Limiter(fakeredis.FakeAsyncRedis(), denial_cache=DenialCache(10)))
    with TestClient(app) as client:
        statuses = [client.get("/v1/models", headers={"X-API-Key": "k"}).status_code for _ in range(3)]
        assert statuses == [200, 200, 429]
        assert client.get("/v1/models", headers={"X-API-Key": "other"}).headers["RateLimit"] == '"key";r=1;t=1000'
