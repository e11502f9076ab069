"""Backend detection on every server of the matrix, forced backends, and
detection again when the backend goes away."""

from __future__ import annotations

import pytest
import redis
import redis.asyncio
from conftest import SLOW, TARGETS, Pool, Target, calls, make_target, run
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.retry import Retry
from tbservers import MODULE, Server, free_port

import redis_tokenbucket.asyncio as tb_asyncio
from redis_tokenbucket import Bucket, Limiter, NoBackendError

B = Bucket(10, SLOW)


def test_first_call_finds_the_backend(target: Target):
    lim = Limiter(target.client())
    assert lim.backend is None
    d = lim.consume("rl:user:42", B)
    assert (d.allowed, d.remaining, d.retry_after_ms, d.reset_after_ms) == (True, 9, 0, 1000 / SLOW)
    assert lim.backend == target.backend
    with target.admin() as admin:
        if target.backend == "functions":  # loaded on demand
            assert admin.function_list(library="tb")
        # A bucket is the same hash whoever wrote it.
        assert set(admin.hgetall("rl:user:42")) == {"tokens", "ts"}


def test_asyncio_finds_the_same_backend(target: Target):
    async def main() -> tuple[str | None, tuple[bool, int]]:
        client = target.async_client()
        try:
            lim = tb_asyncio.Limiter(client)
            d = await lim.consume("rl:user:42", B, 3)
            return lim.backend, (d.allowed, d.remaining)
        finally:
            await client.aclose()

    assert run(main()) == (target.backend, (True, 7))


def test_detect_probes_read_only(target: Target):
    lim = Limiter(target.client())
    assert lim.detect() == target.backend
    with target.admin() as admin:
        assert admin.dbsize() == 0


@pytest.mark.parametrize("forced", ["module", "functions", "eval"])
def test_forced_backend(target: Target, forced: str):
    lim = Limiter(target.client(), backend=forced)  # type: ignore[arg-type]
    assert lim.backend == forced
    order = ["module", "functions", "eval"]
    # A server serves its detected backend and every one after it: the
    # Lua library where FUNCTION works, the EVAL script everywhere.
    if order.index(forced) >= order.index(target.backend):
        assert lim.consume("k", B).remaining == 9
        return
    with pytest.raises(NoBackendError) as raised:
        lim.consume("k", B)
    assert raised.value.causes[0][0] == forced
    with target.admin() as admin:
        assert admin.dbsize() == 0


@pytest.mark.parametrize("name", [n for n, spec in TARGETS.items() if spec.backend == "functions"])
def test_library_flushed_under_the_limiter_is_loaded_again(pool: Pool, name: str):
    target = make_target(pool, name)
    lim = Limiter(target.client())
    lim.consume("k", B)
    with target.admin() as admin:
        admin.function_flush()
        assert lim.consume("k", B).remaining == 8
        assert admin.function_list(library="tb")
    assert lim.backend == "functions"


def test_script_cache_flushed_under_the_limiter(target: Target):
    lim = Limiter(target.client(), backend="eval")
    lim.consume("k", B)
    with target.admin() as admin:
        admin.script_flush()
        admin.config_resetstat()
        assert lim.consume("k", B).remaining == 8
        # One EVALSHA answered NOSCRIPT, one EVAL ran and cached the script,
        assert (calls(admin, "evalsha"), calls(admin, "eval")) == (1, 1)
        assert lim.consume("k", B).remaining == 7
        # and from then on EVALSHA alone.
        assert (calls(admin, "evalsha"), calls(admin, "eval")) == (2, 1)


def test_module_unloaded_under_the_limiter(own_server: Server):
    """A failover to a node without the module looks like this: the next
    call sees "unknown command", detects again and carries on, on the
    same keys."""
    lim = Limiter(own_server.client())
    assert lim.consume("k", B, 2).remaining == 8 and lim.backend == "module"
    with own_server.client() as admin:
        admin.execute_command("MODULE", "UNLOAD", "tb")
    assert lim.consume("k", B, 2).remaining == 6
    assert lim.backend == "functions"
    with own_server.client() as admin:
        admin.execute_command("MODULE", "LOAD", str(MODULE))
    # Where it is now, it stays: the library still works.
    assert lim.consume("k", B).remaining == 5 and lim.backend == "functions"


def test_forced_module_does_not_fall_back(own_server: Server):
    lim = Limiter(own_server.client(), backend="module")
    lim.consume("k", B)
    with own_server.client() as admin:
        admin.execute_command("MODULE", "UNLOAD", "tb")
    with pytest.raises(NoBackendError, match="unknown command"):
        lim.consume("k", B)


def test_nothing_serves_a_user_without_scripting(pool):
    server = pool.server("redis-7.0")
    with server.client() as admin:
        admin.acl_setuser("noscripts", enabled=True, passwords=["+pw"], keys=["*"], commands=["+@all", "-@scripting"])
        admin.function_flush()
    with server.client(username="noscripts", password="pw") as r:
        lim = Limiter(r)
        with pytest.raises(NoBackendError) as raised:
            lim.detect()
        assert [name for name, _ in raised.value.causes] == ["module", "functions", "eval"]
        assert "no permissions to run" in str(raised.value)
        assert lim.backend is None
        # A server that can't run any backend is a deployment error, not
        # an outage: no policy hides it (docs/failure-model.md).
        with pytest.raises(NoBackendError):
            lim.consume("k", B, on_error="open")


def test_bad_backend_name():
    with pytest.raises(ValueError, match="backend must be one of"):
        Limiter(redis.Redis(), backend="lua")  # type: ignore[arg-type]


def test_a_client_of_the_other_kind_is_refused_at_construction(pool: Pool):
    """A blocking Limiter can't await an asyncio client's coroutines (it
    failed with "cannot unpack non-iterable coroutine"), and an asyncio
    Limiter given a blocking client charged, then raised: both are refused
    before any call."""
    blocking = "redis_tokenbucket.Limiter needs a blocking client .* use redis_tokenbucket.asyncio.Limiter"
    awaited = "redis_tokenbucket.asyncio.Limiter needs an asyncio client .* use redis_tokenbucket.Limiter"
    with pytest.raises(TypeError, match=blocking):
        Limiter(redis.asyncio.Redis())
    with pytest.raises(TypeError, match=awaited):
        tb_asyncio.Limiter(redis.Redis())
    cluster = pool.cluster(module=False)
    with RedisCluster(host="127.0.0.1", port=cluster.port) as rc, pytest.raises(TypeError, match=awaited):
        tb_asyncio.Limiter(rc)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=blocking):
        Limiter(AsyncRedisCluster(host="127.0.0.1", port=cluster.port))  # type: ignore[arg-type]
    for not_a_client in (None, "redis://localhost", object()):
        with pytest.raises(TypeError, match="expected a redis-py client"):
            Limiter(not_a_client)  # type: ignore[arg-type]


def test_reset_deletes_the_bucket(target: Target):
    lim = Limiter(target.client())
    assert lim.consume("rl:r", B, 4).remaining == 6
    assert lim.reset("rl:r") is True
    assert lim.peek("rl:r", B).remaining == 10
    assert lim.reset("rl:r") is False  # nothing to delete: full already
    with target.admin() as admin:
        assert admin.dbsize() == 0


def test_reset_asyncio(target: Target):
    async def main() -> tuple[bool, int]:
        client = target.async_client()
        try:
            lim = tb_asyncio.Limiter(client)
            await lim.consume(7, B, 3)
            deleted = await lim.reset("7")
            return deleted, (await lim.peek(7, B)).remaining
        finally:
            await client.aclose()

    assert run(main()) == (True, 10)


def test_reset_raises_redis_errors_whatever_the_policy():
    with pytest.raises(redis.ConnectionError):
        Limiter(redis.Redis(port=free_port(), retry=Retry(NoBackoff(), 0)), on_error="open").reset("rl:r")
