"""The Functions library a server has loaded is trusted only if it is this
package's copy: `FCALL_RO tb_version 0` tells, once per limiter, before its
first FCALL. None, an older one or a foreign one is replaced by the
package's; a user who may not load it uses the EVAL script instead."""

from __future__ import annotations

import asyncio

import pytest
from conftest import SLOW, TARGETS, Pool, Target, calls, make_target, run
from tbservers import Server

import redis_tokenbucket.asyncio as tb_asyncio
from redis_tokenbucket import Bucket, Limiter
from redis_tokenbucket._scripts import library_source, library_version

B = Bucket(10, SLOW)
VERSION = library_version()

# A library named tb whose tb_consume admits everything with 42 left.
FAKE = b"""#!lua name=tb
local function fake() return {1, 42, 0, 0} end
redis.register_function('tb_consume', fake)
redis.register_function{function_name = 'tb_peek', callback = fake, flags = {'no-writes'}}
"""


def older() -> bytes:
    """The package's library as an older release states its version."""
    ours = f"local LIBRARY_VERSION = '{VERSION}'".encode()
    assert library_source().count(ours) == 1
    return library_source().replace(ours, b"local LIBRARY_VERSION = '0.0.1'")


def loaded_version(server: Server) -> str:
    with server.client(decode_responses=True) as admin:
        version: str = admin.execute_command("FCALL_RO", "tb_version", 0)
        return version


def library_code(server: Server) -> bytes:
    with server.client() as admin:
        [fields] = admin.function_list(library="tb", withcode=True)
    code: bytes = dict(zip(fields[::2], fields[1::2], strict=True))[b"library_code"]
    return code


def load(server: Server, library: bytes) -> None:
    with server.client() as admin:
        admin.function_load(library, replace=True)
        admin.config_resetstat()


FUNCTIONS_TARGETS = [name for name, spec in TARGETS.items() if spec.backend == "functions"]


@pytest.mark.parametrize("name", FUNCTIONS_TARGETS)
@pytest.mark.parametrize("library", [FAKE, older()], ids=["foreign", "older"])
def test_a_library_that_is_not_ours_is_replaced(pool: Pool, name: str, library: bytes):
    target = make_target(pool, name)
    load(target.server, library)
    lim = Limiter(target.client())
    assert lim.consume("rl:k", B).remaining == 9
    assert lim.backend == "functions"
    assert loaded_version(target.server) == VERSION
    with target.admin() as admin:
        assert calls(admin, "function|load") == 1


@pytest.mark.parametrize("name", FUNCTIONS_TARGETS)
def test_our_library_is_checked_once_and_left_alone(pool: Pool, name: str):
    target = make_target(pool, name)
    load(target.server, library_source())
    lim = Limiter(target.client())
    assert [lim.consume("rl:k", B).remaining for _ in range(3)] == [9, 8, 7]
    with target.admin() as admin:
        assert calls(admin, "function|load") == 0
        # One tb_version, then the calls themselves.
        assert (calls(admin, "fcall_ro"), calls(admin, "fcall")) == (1, 3)


def test_asyncio_checks_the_library_too(pool: Pool):
    target = make_target(pool, "redis-7.0")
    load(target.server, FAKE)

    async def main() -> int:
        client = target.async_client()
        try:
            return (await tb_asyncio.Limiter(client).consume("rl:k", B)).remaining
        finally:
            await client.aclose()

    assert run(main()) == 9
    assert loaded_version(target.server) == VERSION


@pytest.mark.parametrize("library", [FAKE, older()], ids=["foreign", "older"])
def test_a_user_who_may_not_load_ours_uses_the_eval_script(pool: Pool, library: bytes):
    """An ACL user without FUNCTION can't replace the library an operator
    loaded; it runs the EVAL script, and the library is left as it was."""
    target = make_target(pool, "redis-7.0-acl")
    load(target.server, library)
    lim = Limiter(target.client())
    assert lim.consume("rl:k", B).remaining == 9
    assert lim.backend == "eval"
    assert library_code(target.server) == library


def test_a_user_who_may_not_load_ours_uses_it_where_an_operator_loaded_it(pool: Pool):
    target = make_target(pool, "redis-7.0-acl")
    load(target.server, library_source())
    lim = Limiter(target.client())
    assert lim.consume("rl:k", B).remaining == 9
    assert lim.backend == "functions"


def test_a_library_without_tb_version_is_not_trusted_by_a_second_limiter(module_target: Target):
    """The module backend never looks at the library; the Functions backend,
    forced on the same server, does."""
    load(module_target.server, FAKE)
    assert Limiter(module_target.client()).consume("rl:m", B).remaining == 9
    forced = Limiter(module_target.client(), backend="functions")
    assert forced.consume("rl:m", B).remaining == 8
    assert loaded_version(module_target.server) == VERSION


@pytest.mark.parametrize("name", FUNCTIONS_TARGETS)
def test_a_burst_of_first_calls_loads_the_library_once(pool: Pool, name: str):
    """Fifty concurrent first calls on a server without the library: one of
    them checks and loads it; the others, meanwhile, answer through the EVAL
    script instead of each loading it (every FUNCTION LOAD compiles the
    library while Redis waits). All fifty are charged exactly once."""
    target = make_target(pool, name)
    with target.admin() as admin:
        admin.function_flush()
        admin.config_resetstat()

    async def burst() -> list[int]:
        client = target.async_client()
        try:
            lim = tb_asyncio.Limiter(client, timeout=10)
            decisions = await asyncio.gather(*(lim.consume("rl:burst", Bucket(100, SLOW)) for _ in range(50)))
            return [d.remaining for d in decisions]
        finally:
            await client.aclose()

    remaining = run(burst())
    assert sorted(remaining) == list(range(50, 100))
    with target.admin() as admin:
        assert calls(admin, "function|load") == 1
    assert loaded_version(target.server) == VERSION


@pytest.mark.parametrize("name", ["redis-7.0", "redis-6.2"])
def test_detect_warns_where_the_server_can_evict_the_librarys_keys(
    pool: Pool, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    # The Lua library can't warn as the module does: the readiness probe
    # reads the eviction settings once and logs the module's own line.
    target = make_target(pool, name)
    with target.server.client() as admin:
        admin.config_set("maxmemory", 1 << 30)
        admin.config_set("maxmemory-policy", "volatile-ttl")
    try:
        lim = Limiter(target.client())
        with caplog.at_level("WARNING", logger="redis_tokenbucket"):
            assert lim.detect() in ("functions", "eval")
            lim.detect()  # once per limiter
        warned = [r.getMessage() for r in caplog.records if "maxmemory-policy" in r.getMessage()]
        assert warned == [
            "tb: maxmemory-policy volatile-ttl with maxmemory 1073741824 evicts keys with a TTL, and every bucket "
            "and lease key has one (often shorter than other keys', so they go first): an evicted bucket comes "
            "back full, minting the tokens it had spent, and an evicted lease key frees every slot of its cap. "
            "Set maxmemory-policy noeviction, or keep the limits on an instance or database of their own"
        ]
        caplog.clear()
        with target.server.client() as admin:
            admin.config_set("maxmemory-policy", "noeviction")
        with caplog.at_level("WARNING", logger="redis_tokenbucket"):
            Limiter(target.client()).detect()
        assert not [r for r in caplog.records if "maxmemory-policy" in r.getMessage()]
    finally:
        with target.server.client() as admin:
            admin.config_set("maxmemory", 0)
            admin.config_set("maxmemory-policy", "noeviction")
