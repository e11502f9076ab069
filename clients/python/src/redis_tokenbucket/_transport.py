"""How a command reaches Redis (docs/failure-model.md).

For a plain ``redis.Redis`` / ``redis.asyncio.Redis`` the limiter keeps its
own connections: redis-py ``Connection`` objects made from the client's
connection settings, driven through redis-py's public connection API
(``connect``, ``send_packed_command``, ``read_response``, ``can_read``,
``disconnect``; replies parsed by redis-py, with hiredis when installed;
commands packed by `_pack`), so that:

- the budget (`timeout`) runs from the moment the command is written;
- redis-py's retries (and their backoff) can't multiply the budget: these
  connections never retry, the limiter and its breaker decide;
- a connection the server closed while it sat idle (its `timeout`, CLIENT
  KILL, a load balancer's idle cut) is not an outage: the command goes
  once more on a new connection, within the same budget, unless a second
  run could mint tokens (a refund, a reset: `Once`), which is sent again
  only where it provably never reached Redis;
- waiting for a connection is bounded and, when it can't be had, is local
  overload (`Shed`), never a Redis failure: the sync limiter's (at most the
  pool's `max_connections` of them), the asyncio limiter's one shared
  connection (when it is not up within the budget).

The limiter owns one transport (`SyncTransport`, `AsyncTransport`): the
sync limiter's connections are in `_sync_transport`, the asyncio one's
shared, auto-pipelined connection in `_async_transport`. Other
clients (Cluster, Sentinel, fakeredis, a custom pool) go through their
own ``execute_command``: their own timeouts and retries apply, and the
asyncio limiter bounds the call (`bounded`).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Any, Optional

import redis
import redis.asyncio
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.retry import Retry

from ._async_transport import AsyncConnections, bounded
from ._classify import Kind, classify
from ._commands import Command, Once, ToNode, Waited, waited_reply
from ._errors import LimiterError, Shed
from ._sync_transport import SyncConnections

# redis-py 7.1+ names the client to the server with a DriverInfo.
_DRIVER_INFO = importlib.util.find_spec("redis.driver_info") is not None

# A pool bigger than this is unbounded (redis-py 5's default is 2**31).
_UNBOUNDED = 2**30


def owned_settings(pool: Any, timeout: float, sync: bool) -> Optional[dict[str, Any]]:
    """The client's connection settings for the limiter's own connections,
    or None when this is not a pool the limiter can copy (a Sentinel pool,
    fakeredis, a custom connection class)."""
    std = (
        (redis.ConnectionPool, redis.BlockingConnectionPool)
        if sync
        else (redis.asyncio.ConnectionPool, redis.asyncio.BlockingConnectionPool)
    )
    conns = (
        (redis.Connection, redis.SSLConnection, redis.UnixDomainSocketConnection)
        if sync
        else (redis.asyncio.Connection, redis.asyncio.SSLConnection, redis.asyncio.UnixDomainSocketConnection)
    )
    if type(pool) not in std or pool.connection_class not in conns:
        return None
    settings = dict(pool.connection_kwargs)
    retry_class = Retry if sync else AsyncRetry
    connect = settings.get("socket_connect_timeout") or settings.get("socket_timeout") or timeout
    settings.update(
        retry=retry_class(NoBackoff(), 0),
        retry_on_timeout=False,
        retry_on_error=[],
        # Sync: the socket's timeout is the budget. Asyncio: the pipe's
        # watchdog is (a socket_timeout there would add a wait_for per write).
        socket_timeout=timeout if sync else None,
        socket_connect_timeout=min(connect, timeout) if sync else None,
        health_check_interval=0,
    )
    # No CLIENT SETINFO round trips on connect: without a password, a db or
    # RESP3, connecting is then the TCP connect alone (redis-py 7.1+ spells
    # it driver_info=None, older ones lib_name/lib_version=None).
    settings.pop("lib_name", None)
    settings.pop("lib_version", None)
    if settings.get("protocol") is None:
        # RESP2 unless the client asked for 3: redis-py 8 defaults to 3,
        # whose HELLO is a round trip on every connect; the replies the
        # limiter reads (arrays of integers) are the same in both.
        settings["protocol"] = 2
    if "maint_notifications_config" in settings:
        # redis-py 7+ probes with HELLO 3 on connect ("auto"): another round
        # trip, and notifications the limiter has no use for.
        from redis.maint_notifications import MaintNotificationsConfig  # type: ignore[import-not-found, unused-ignore]

        settings["maint_notifications_config"] = MaintNotificationsConfig(enabled=False)
    if _DRIVER_INFO:
        settings["driver_info"] = None
    else:
        settings.update(lib_name=None, lib_version=None)
    return settings


def max_connections(pool: Any) -> Optional[int]:
    """The pool's max_connections, or None when it has no useful bound."""
    limit = getattr(pool, "max_connections", None)
    return limit if isinstance(limit, int) and 0 < limit < _UNBOUNDED else None


def sync_connections(client: Any, timeout: Optional[float]) -> Optional[SyncConnections]:
    if timeout is None or type(client) is not redis.Redis or client.connection is not None:
        return None
    pool = client.connection_pool
    settings = owned_settings(pool, timeout, sync=True)
    if settings is None:
        return None
    return SyncConnections(lambda: pool.connection_class(**settings), timeout, max_connections(pool))


def async_connections(client: Any, timeout: Optional[float]) -> Optional[AsyncConnections]:
    if timeout is None or type(client) is not redis.asyncio.Redis or client.connection is not None:
        return None
    pool = client.connection_pool
    settings = owned_settings(pool, timeout, sync=False)
    if settings is None:
        return None
    return AsyncConnections(lambda: pool.connection_class(**settings), timeout)


Send = Callable[[Command, Optional[float]], Any]
"""Sends one command a plan yields, within its timeout (seconds, or None)."""


class SyncTransport:
    """How the sync limiter's commands reach Redis: its own connections
    over a plain ``redis.Redis`` (`SyncConnections`), else the client's
    own ``execute_command``. `send` is what a plan's commands go through."""

    asyncio = False

    def __init__(self, client: Any, timeout: Optional[float]) -> None:
        self.client = client
        self.conns = sync_connections(client, timeout)
        self.send: Send = self.conns.call if self.conns is not None else self._via_client()

    def _via_client(self) -> Send:
        execute = client_sender(self.client, self._waited)
        return lambda command, timeout: execute(command)

    def _waited(self, command: Waited) -> Any:
        return waited_reply(wait_pipeline(self.client, command))

    def close(self) -> None:
        """Closes the limiter's own connections; later sends raise."""
        self.send = _closed
        if self.conns is not None:
            self.conns.close()


class AsyncTransport:
    """How the asyncio limiter's commands reach Redis: its one shared
    connection over a plain ``redis.asyncio.Redis`` (`AsyncConnections`),
    else the client's own ``execute_command`` under the budget (`bounded`)."""

    asyncio = True

    def __init__(self, client: Any, timeout: Optional[float]) -> None:
        self.client = client
        self.conns = async_connections(client, timeout)
        self.send: Send = self.conns.call if self.conns is not None else self._via_client()

    def _via_client(self) -> Send:
        execute = client_sender(self.client, self._waited)

        def send(command: Command, timeout: Optional[float]) -> Any:
            if timeout is None:
                return execute(command)
            return bounded(execute(command), timeout)

        return send

    async def _waited(self, command: Waited) -> Any:
        return waited_reply(await wait_pipeline(self.client, command))

    async def aclose(self) -> None:
        """Closes the limiter's own connection; later sends raise."""
        self.send = _aclosed
        if self.conns is not None:
            await self.conns.aclose()


def wait_pipeline(client: Any, command: Waited) -> Any:
    """A command with WAIT behind it, in one pipeline of the client's: its
    replies (awaitable on an asyncio client), errors among them."""
    pipe = client.pipeline(transaction=False)
    pipe.execute_command(*command.command)
    pipe.execute_command(*command.wait)
    return pipe.execute(raise_on_error=False)


def client_sender(client: Any, waited: Callable[[Waited], Any]) -> Callable[[Command], Any]:
    """The client's own execute_command, for clients the limiter keeps
    no connections of (Cluster, fakeredis, ..., or timeout=None)."""
    execute: Callable[..., Any] = client.execute_command

    def send(command: Command) -> Any:
        if isinstance(command, Once):
            command = command.command
        if isinstance(command, ToNode):
            return execute(*command.args, target_nodes=command.node)
        if isinstance(command, Waited):
            return waited(command)
        return execute(*command)

    return send


def _closed(command: Command, timeout: Optional[float]) -> Any:
    raise LimiterError("the limiter is closed")


async def _aclosed(command: Command, timeout: Optional[float]) -> Any:
    raise LimiterError("the limiter is closed")


__all__ = [
    "AsyncConnections",
    "AsyncTransport",
    "Kind",
    "Shed",
    "SyncConnections",
    "SyncTransport",
    "async_connections",
    "bounded",
    "classify",
    "sync_connections",
]
