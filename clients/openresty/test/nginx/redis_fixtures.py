"""The Redis every nginx test runs against: Redis 7.0 with the module,
and without it (the Lua library), once per session each; `r` is a client
of it, flushed for each test. The module's tests and the nginx gateway
example's import these fixtures into their conftest."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
from tbservers import Server


@pytest.fixture(scope="session", params=["module", "library"])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = Server("redis-7.0", tmp_path_factory.mktemp(request.param), module=request.param == "module").start()
    s.backend = "module" if request.param == "module" else "functions"  # type: ignore[attr-defined]
    yield s
    s.stop()


@pytest.fixture
def r(server: Server) -> Iterator[redis.Redis]:
    client = server.client()
    client.flushall()
    client.function_flush()
    yield client
    client.close()
