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

The sync limiter's connections are in `_sync_transport`, the asyncio
one's shared, auto-pipelined connection in `_async_transport`. Other
clients (Cluster, Sentinel, fakeredis, a custom pool) go through their
own ``execute_command``: their own timeouts and retries apply, and the
asyncio limiter bounds the call (`bounded`).
"""

from __future__ import annotations

import importlib.util
from typing import Any, Optional

import redis
import redis.asyncio
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.retry import Retry

from ._async_transport import AsyncConnections, bounded
from ._classify import Kind, classify
from ._errors import Shed
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


__all__ = [
    "AsyncConnections",
    "Kind",
    "Shed",
    "SyncConnections",
    "async_connections",
    "bounded",
    "classify",
    "sync_connections",
]
