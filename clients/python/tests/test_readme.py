"""Every Python snippet of the READMEs runs as a reader who copies it runs
it: on its own, with nothing from the snippets before it. The servers they
name are the test's own: `redis.Redis()` and `redis.asyncio.Redis()` reach
a Redis 7.0 with the module, `redis.cluster.RedisCluster(...)` a Cluster of
three with the module. A snippet that defines a FastAPI `app` has each of
its GET routes called (none may answer 5xx), and a `test_*` function it
defines is run."""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio
import redis.cluster
from conftest import Pool, Target
from fastapi import FastAPI
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient
from tbservers import ROOT

from redis_tokenbucket import Bucket, Decision, MultiDecision
from redis_tokenbucket.fastapi import problem_response

READMES = [ROOT / "README.md", ROOT / "clients" / "python" / "README.md"]
# A fenced block, also indented in a list item.
FENCE = re.compile(r"^([ \t]*)```(\w*)\n(.*?)^\1```$", re.MULTILINE | re.DOTALL)


def blocks(readme: Path, language: str) -> list[tuple[int, str]]:
    """(line, code) of each fenced block in `language`."""
    text = readme.read_text(encoding="utf-8")
    return [
        (text.count("\n", 0, m.start()) + 1, textwrap.dedent(m.group(3)))
        for m in FENCE.finditer(text)
        if m.group(2) == language
    ]


def servers_of_the_test(monkeypatch: pytest.MonkeyPatch, port: int, cluster_port: int) -> None:
    """Whatever host and port a snippet names, its clients reach these."""

    class Redis(redis.Redis):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **{**kwargs, "host": "127.0.0.1", "port": port})

    class AsyncRedis(redis.asyncio.Redis):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **{**kwargs, "host": "127.0.0.1", "port": port})

    class RedisCluster(redis.cluster.RedisCluster):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **{**kwargs, "host": "127.0.0.1", "port": cluster_port})

    monkeypatch.setattr(redis, "Redis", Redis)
    monkeypatch.setattr(redis, "StrictRedis", Redis)
    monkeypatch.setattr(redis.asyncio, "Redis", AsyncRedis)
    monkeypatch.setattr(redis.cluster, "RedisCluster", RedisCluster)
    monkeypatch.setattr(redis, "RedisCluster", RedisCluster)


def exercise(app: FastAPI, where: str) -> None:
    paths = [r.path for r in app.routes if isinstance(r, APIRoute) and "GET" in r.methods and "{" not in r.path]
    assert paths, f"{where}: an app without a GET route to call"
    with TestClient(app) as client:
        for path in paths:
            status = client.get(path, headers={"X-API-Key": "readme"}).status_code
            assert status < 500, f"{where}: GET {path} answered {status}"


@pytest.mark.parametrize("readme", READMES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_python_snippet_runs(readme: Path, module_target: Target, pool: Pool, monkeypatch: pytest.MonkeyPatch):
    snippets = blocks(readme, "python")
    assert snippets
    servers_of_the_test(monkeypatch, module_target.server.port, pool.cluster(module=True).port)
    for line, code in snippets:
        where = f"{readme.relative_to(ROOT)}:{line}"
        namespace: dict[str, Any] = {"__name__": "readme"}
        exec(compile(code, where, "exec"), namespace)
        app = namespace.get("app")
        if isinstance(app, FastAPI):
            exercise(app, where)
        for name, value in namespace.items():
            if name.startswith("test_") and callable(value):
                value()


def test_the_problem_body_shown_is_the_one_sent():
    [(line, shown)] = blocks(READMES[1], "json")
    key = Bucket(10, 0.17, name="key")
    denial = MultiDecision(False, 6000, (Decision(False, 0, 6000, 58_824, "rl:key:k", key, 1),))
    assert json.loads(shown) == json.loads(bytes(problem_response(denial).body)), f"README.md:{line}"
