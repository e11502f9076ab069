"""The package stands on public ground: no attribute or name
starting with `_` of a redis-py or asyncio object is read anywhere in it,
so one redis-py or CPython release can't break every user at once.

A scan of the installed package's source (the wheel's files). An object
may read its own private state (`self._x`, `cls._x`), and the package's
modules each other's private names; anything else starting with `_` is a
finding:

- `obj._name` on another object, unless `_name` is one the package itself
  defines AND no redis-py or asyncio object has an attribute of that name
  (so `conn._reader` can't pass for the package's own `_reader`);
- `getattr(obj, "_name")` (and hasattr, setattr) on anything but self;
- `from redis... import _name`, or a private module (`redis._parsers`).
"""

from __future__ import annotations

import ast
import asyncio
import inspect
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import redis.asyncio
import redis.asyncio.connection
import redis.connection

import redis_tokenbucket

PACKAGE = Path(redis_tokenbucket.__file__).resolve().parent
SOURCES = sorted(PACKAGE.glob("*.py"))


def private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def third_party_private_names() -> set[str]:
    """Private attribute names of the redis-py and asyncio objects the
    package handles: their classes' and their instances' (a connection,
    a stream, a task, a future, a loop)."""
    names: set[str] = set()
    classes: list[type] = [
        redis.Redis,
        redis.asyncio.Redis,
        redis.ConnectionPool,
        redis.BlockingConnectionPool,
        redis.asyncio.ConnectionPool,
        redis.asyncio.BlockingConnectionPool,
        redis.connection.Connection,
        redis.connection.SSLConnection,
        redis.connection.UnixDomainSocketConnection,
        redis.asyncio.connection.Connection,
        redis.asyncio.connection.SSLConnection,
        redis.asyncio.connection.UnixDomainSocketConnection,
        asyncio.Task,
        asyncio.Future,
        asyncio.StreamReader,
        asyncio.StreamWriter,
        asyncio.Semaphore,
        asyncio.Event,
        asyncio.TimerHandle,
        asyncio.Handle,
        type(asyncio.new_event_loop()),
    ]
    for cls in classes:
        for klass in inspect.getmro(cls):
            names.update(n for n in vars(klass) if private(n))
            names.update(n for n in getattr(klass, "__slots__", ()) if private(n))
    loop = asyncio.new_event_loop()
    try:
        instances = [
            redis.connection.Connection(),
            redis.asyncio.connection.Connection(),
            redis.ConnectionPool(),
            redis.asyncio.ConnectionPool(),
            asyncio.StreamReader(loop=loop),
            loop.create_future(),
            loop,
        ]
        for obj in instances:
            names.update(n for n in getattr(obj, "__dict__", {}) if private(n))
    finally:
        loop.close()
    return names


SLOTS = "__slots__"


def own_private_names(trees: list[ast.Module]) -> set[str]:
    """The private names the package defines: attributes it assigns on
    self or cls, names bound in its class bodies and modules, __slots__."""
    names: set[str] = set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and private(node.attr):
                names.add(node.attr)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and private(node.name):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store) and private(node.id):
                names.add(node.id)
            elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == SLOTS for t in node.targets):
                names.update(
                    c.value for c in ast.walk(node.value) if isinstance(c, ast.Constant) and isinstance(c.value, str)
                )
    return names


def findings(source: str, filename: str, own: set[str], foreign: set[str]) -> Iterator[str]:
    tree = ast.parse(source, filename)
    for node in ast.walk(tree):
        where = f"{filename}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Attribute) and private(node.attr):
            base = node.value
            if isinstance(base, ast.Name) and base.id in ("self", "cls"):
                continue
            if node.attr in own and node.attr not in foreign:
                continue
            yield f"{where}: {ast.unparse(node)}"
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id in ("getattr", "hasattr", "setattr", "delattr") and len(node.args) >= 2:
                target, name = node.args[0], node.args[1]
                named = isinstance(name, ast.Constant) and isinstance(name.value, str) and private(name.value)
                if named and not (isinstance(target, ast.Name) and target.id in ("self", "cls")):
                    yield f"{where}: {ast.unparse(node)}"
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            parts = node.module.split(".")
            if any(private(p) for p in parts) or any(private(a.name) for a in node.names):
                yield f"{where}: {ast.unparse(node)}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if any(private(p) for p in alias.name.split(".")):
                    yield f"{where}: {ast.unparse(node)}"


def test_the_scan_sees_the_package():
    assert {p.name for p in SOURCES} >= {"_engine.py", "_limiter.py", "asyncio.py", "fastapi.py"}


@pytest.mark.parametrize(
    "snippet",
    [
        "conn._sock.recv(1)",
        "self.conn._reader.read(1)",  # the package has a `_reader` of its own: still a finding
        "getattr(task, '_fut_waiter', None)",
        "from redis._parsers import _RESP2Parser",
        "import redis._parsers.hiredis",
    ],
)
def test_the_scan_finds_a_private_attribute(snippet: str):
    own = {"_reader"}
    assert list(findings(snippet, "snippet.py", own, third_party_private_names()))


def test_no_private_attribute_of_redis_py_or_asyncio_in_the_package():
    trees = [ast.parse(p.read_text(encoding="utf-8"), p.name) for p in SOURCES]
    own = own_private_names(trees)
    foreign = third_party_private_names()
    found = [f for p in SOURCES for f in findings(p.read_text(encoding="utf-8"), p.name, own, foreign)]
    assert not found, "private attributes of other libraries:\n" + "\n".join(found)
