"""Fixtures: the servers of the compatibility matrix, started once per
session on demand, and a clean state for each test.

`target` runs a test on every server and access path the package must
handle, each with the backend it must find:

| target            | server                | backend   |
|-------------------|-----------------------|-----------|
| redis-7.0+module  | Redis 7.0 + module    | module    |
| redis-7.0         | Redis 7.0             | functions |
| valkey-9.1        | Valkey 9.1            | functions |
| redis-8.2         | Redis 8.2             | functions |
| redis-6.2         | Redis 6.2             | eval      |
| redis-7.0-acl     | Redis 7.0, as a user whose ACL refuses FUNCTION | eval |
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, TypeVar

import pytest
import redis
import redis.asyncio
from tbservers import Cluster, Server

T = TypeVar("T")

# A refill so slow that no test lives long enough to see a whole token back.
SLOW = 0.001

ACL_USER, ACL_PASSWORD = "nofunction", "pw"


@dataclass(frozen=True)
class TargetSpec:
    kind: str
    module: bool
    user: Optional[str]
    backend: str


TARGETS = {
    "redis-7.0+module": TargetSpec("redis-7.0", True, None, "module"),
    "redis-7.0": TargetSpec("redis-7.0", False, None, "functions"),
    "valkey-9.1": TargetSpec("valkey-9.1", False, None, "functions"),
    "redis-8.2": TargetSpec("redis-8.2", False, None, "functions"),
    "redis-6.2": TargetSpec("redis-6.2", False, None, "eval"),
    "redis-7.0-acl": TargetSpec("redis-7.0", False, ACL_USER, "eval"),
}


class Pool:
    """Servers shared by the session, started on first use."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.servers: dict[tuple[str, bool], Server] = {}
        self.clusters: dict[bool, Cluster] = {}

    def server(self, kind: str, module: bool = False) -> Server:
        if (kind, module) not in self.servers:
            name = f"{kind}{'+module' if module else ''}"
            server = Server(kind, self.workdir / name, module=module).start()
            self.servers[kind, module] = server
            if kind == "redis-7.0" and not module:
                # Everything but FUNCTION: FCALL works once the library is
                # there, but the client can't load it, so it must use EVAL.
                with server.client() as admin:
                    admin.acl_setuser(ACL_USER, enabled=True, passwords=[f"+{ACL_PASSWORD}"],
                                      keys=["*"], channels=["*"], commands=["+@all", "-function"])  # fmt: skip
        return self.servers[kind, module]

    def cluster(self, module: bool) -> Cluster:
        if module not in self.clusters:
            name = "cluster+module" if module else "cluster"
            self.clusters[module] = Cluster("redis-7.0", self.workdir / name, module=module).start()
        return self.clusters[module]

    def close(self) -> None:
        for server in self.servers.values():
            server.stop()
        for cluster in self.clusters.values():
            cluster.stop()


@pytest.fixture(scope="session")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pool]:
    p = Pool(tmp_path_factory.mktemp("servers"))
    yield p
    p.close()


@dataclass(frozen=True)
class Target:
    name: str
    spec: TargetSpec
    server: Server

    @property
    def backend(self) -> str:
        return self.spec.backend

    @property
    def auth(self) -> dict[str, Any]:
        if self.spec.user is None:
            return {}
        return {"username": self.spec.user, "password": ACL_PASSWORD}

    def client(self, **kwargs: Any) -> redis.Redis:
        """A client as the limiter's user."""
        return redis.Redis(port=self.server.port, **self.auth, **kwargs)

    def async_client(self, **kwargs: Any) -> redis.asyncio.Redis:
        return redis.asyncio.Redis(port=self.server.port, **self.auth, **kwargs)

    def admin(self) -> redis.Redis:
        return redis.Redis(port=self.server.port, decode_responses=True)


def clean(server: Server) -> None:
    """No buckets, no Lua library, no cached scripts, fresh command stats:
    every test starts from a server that has never seen the limiter."""
    with server.client() as admin:
        admin.flushall()
        if server.kind != "redis-6.2":
            admin.function_flush()
        admin.script_flush()
        admin.config_resetstat()


def make_target(pool: Pool, name: str) -> Target:
    spec = TARGETS[name]
    target = Target(name, spec, pool.server(spec.kind, spec.module))
    clean(target.server)
    return target


@pytest.fixture(params=list(TARGETS))
def target(request: pytest.FixtureRequest, pool: Pool) -> Target:
    return make_target(pool, request.param)


@pytest.fixture
def module_target(pool: Pool) -> Target:
    return make_target(pool, "redis-7.0+module")


@pytest.fixture
def own_server(tmp_path: Path) -> Iterator[Server]:
    """A Redis 7.0 with the module for this test alone: it may be paused,
    stopped, or lose its module."""
    server = Server("redis-7.0", tmp_path / "own", "--enable-module-command", "yes", module=True).start()
    yield server
    server.resume()
    server.stop()


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Runs an asyncio test body (no plugin needed)."""
    return asyncio.run(coro)


def calls(client: redis.Redis, *commands: str) -> int:
    """How often the server ran these commands since the stats were reset."""
    stats = client.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{c.lower()}", {}).get("calls", 0)) for c in commands)


@contextmanager
def all_connections_busy(lim: Any) -> Iterator[None]:
    """As if other threads' calls held every connection of a sync limiter
    (over a redis.Redis whose pool has `max_connections`): no slot of its
    gate, one per connection, is free until the block ends."""
    conns = lim._transport.conns
    assert conns is not None and conns.gate is not None, "a sync limiter over a pool with max_connections"
    gate = conns.gate
    taken = 0
    while gate.acquire(blocking=False):
        taken += 1
    try:
        yield
    finally:
        for _ in range(taken):
            gate.release()
