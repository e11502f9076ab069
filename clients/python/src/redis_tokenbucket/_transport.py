"""How a command reaches Redis, and how a failure of Redis is told apart
from the gateway being busy (docs/failure-model.md).

For a plain ``redis.Redis`` / ``redis.asyncio.Redis`` the limiter keeps its
own connections, made from the client's connection settings, so that:

- the budget (`timeout`) runs from the moment the command is written:
  the sync limiter rides the socket's own timeout (no thread), the
  asyncio limiter arms one timer per command;
- redis-py's retries (and their backoff) can't multiply the budget: these
  connections never retry, the limiter and its breaker decide;
- waiting for a connection (all of them busy) is bounded by the same
  budget and, when it runs out, is local overload (`Shed`), never a Redis
  failure;
- a connection whose command got no answer is closed, so a late reply is
  never read as the answer to another command.

Other clients (Cluster, Sentinel, fakeredis, a custom pool) go through
their own ``execute_command``: their own timeouts and retries apply, and
the asyncio limiter still bounds the call with its timer.
"""

from __future__ import annotations

import asyncio
import importlib.util
import select
import sys
import threading
from collections.abc import Callable
from typing import Any, Literal, Optional

import redis
import redis.asyncio
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.exceptions import (
    AuthenticationError,
    AuthorizationError,
    BusyLoadingError,
    ConnectionError,
    ReadOnlyError,
    RedisClusterException,
    RedisError,
    ResponseError,
)
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

from ._errors import LimiterError, NoBackendError

Kind = Literal["failure", "shed", "usage"]

# redis-py 7.1+ names the client to the server with a DriverInfo.
_DRIVER_INFO = importlib.util.find_spec("redis.driver_info") is not None

# A pool bigger than this is unbounded (redis-py 5's default is 2**31).
_UNBOUNDED = 2**30

# Error replies that say the server can't serve now (a failover, a restart,
# a script that runs too long, a full memory), as opposed to "your request
# is wrong". redis-py turns some into their own classes and drops the code.
_UNAVAILABLE_CODES = ("LOADING", "MASTERDOWN", "CLUSTERDOWN", "READONLY", "BUSY ", "OOM ", "TRYAGAIN")
_POOL_EXHAUSTED = ("too many connections", "no connection available")


class Shed(LimiterError):
    """The call could not get its decision in time for a local reason (no
    free connection within the budget, an event loop too far behind): the
    gateway is overloaded, Redis did not fail. Never admitted."""


def classify(exc: BaseException) -> Kind:
    """What an error means for the failure policy: Redis failing
    ("failure"), the process overloaded ("shed"), or a usage error that
    always raises ("usage": a bad argument, a key of the wrong type, a
    server that refuses the user, which no policy should hide)."""
    if isinstance(exc, Shed):
        return "shed"
    if isinstance(exc, (AuthenticationError, AuthorizationError, NoBackendError)):
        return "usage"
    if isinstance(exc, ConnectionError):
        # redis-py's pool running out (MaxConnectionsError in redis-py 6+,
        # a plain ConnectionError before) is back-pressure, not an outage.
        text = str(exc).lower()
        if type(exc).__name__ == "MaxConnectionsError" or any(t in text for t in _POOL_EXHAUSTED):
            return "shed"
        return "failure"
    if isinstance(exc, (RedisTimeoutError, TimeoutError, asyncio.TimeoutError, BusyLoadingError, ReadOnlyError)):
        return "failure"
    if isinstance(exc, ResponseError):
        name = type(exc).__name__
        if name in ("ClusterDownError", "MasterDownError", "TryAgainError", "OutOfMemoryError"):
            return "failure"
        text = str(exc)
        return "failure" if text.startswith(_UNAVAILABLE_CODES) else "usage"
    if isinstance(exc, RedisClusterException):
        # No node reachable, no slot map: the cluster is not serving.
        return "failure"
    if isinstance(exc, OSError):
        return "failure"
    return "usage"  # DataError, TypeError, ValueError, ...: the caller's


def _owned_settings(pool: Any, timeout: float, sync: bool) -> Optional[dict[str, Any]]:
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
        # Sync: the socket's timeout is the budget. Asyncio: the limiter's
        # timer is; a socket_timeout there would add a wait_for per write.
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


def _max_connections(pool: Any) -> Optional[int]:
    limit = getattr(pool, "max_connections", None)
    return limit if isinstance(limit, int) and 0 < limit < _UNBOUNDED else None


# ---- sync --------------------------------------------------------------------


class SyncConnections:
    """The sync limiter's own connections to the client's server."""

    def __init__(self, pool: Any, settings: dict[str, Any], timeout: float) -> None:
        self._make: Callable[[], Any] = lambda: pool.connection_class(**settings)
        self.timeout = timeout
        self._idle: list[Any] = []
        self._all: list[Any] = []
        self._lock = threading.Lock()
        limit = _max_connections(pool)
        self._gate = threading.BoundedSemaphore(limit) if limit else None

    def call(self, args: tuple[Any, ...], timeout: Optional[float]) -> Any:
        budget = self.timeout if timeout is None else timeout
        gate = self._gate
        if gate is not None and not gate.acquire(timeout=budget):
            raise Shed(f"no connection to Redis free within {budget} s")
        try:
            try:
                conn = self._idle.pop()
            except IndexError:
                conn = self._make()
                with self._lock:
                    self._all.append(conn)
            try:
                reply = self._roundtrip(conn, args, budget)
            except ResponseError:
                self._idle.append(conn)  # an error reply, read whole: the connection is fine
                raise
            except BaseException:
                conn.disconnect()  # nothing of this command may be read later
                self._idle.append(conn)
                raise
            self._idle.append(conn)
            return reply
        finally:
            if gate is not None:
                gate.release()

    def _roundtrip(self, conn: Any, args: tuple[Any, ...], budget: float) -> Any:
        if conn._sock is None:
            conn.connect()
        if budget == self.timeout:
            conn.send_packed_command(conn.pack_command(*args), check_health=False)
            return conn.read_response()
        # Another budget for this call: the socket's timeout, put back after.
        sock = conn._sock
        sock.settimeout(budget)
        try:
            conn.send_packed_command(conn.pack_command(*args), check_health=False)
            return conn.read_response()
        finally:
            if conn._sock is sock:
                sock.settimeout(self.timeout)

    def close(self) -> None:
        with self._lock:
            conns, self._all, self._idle = self._all, [], []
        for conn in conns:
            conn.disconnect()


def sync_connections(client: Any, timeout: Optional[float]) -> Optional[SyncConnections]:
    if timeout is None or type(client) is not redis.Redis or client.connection is not None:
        return None
    pool = client.connection_pool
    settings = _owned_settings(pool, timeout, sync=True)
    return None if settings is None else SyncConnections(pool, settings, timeout)


# ---- asyncio -----------------------------------------------------------------


class _Deadline:
    """One timer for one wait of one task. When it fires, `expired()`
    decides: True cancels the task (the wait is over), False re-arms it
    (progress: the answer is arriving)."""

    __slots__ = ("budget", "conn", "expired", "fired", "handle", "late", "loop", "task")

    def __init__(self, budget: float, expired: Callable[[_Deadline], bool], conn: Any = None) -> None:
        self.loop = asyncio.get_running_loop()
        self.task = asyncio.current_task()
        self.budget = budget
        self.expired = expired
        self.conn = conn
        self.fired = False
        self.late = 0.0  # how late the timer ran, the event loop's lag
        due = self.loop.time() + budget
        self.handle = self.loop.call_at(due, self._fire, due)

    def _fire(self, due: float) -> None:
        now = self.loop.time()
        self.late = now - due
        # A task whose wait is already over (its reply came, it only waits
        # for its turn in a busy loop) is not waiting on Redis: re-arm.
        waiter = getattr(self.task, "_fut_waiter", None)
        if (waiter is None or waiter.done()) and self.task is not None and not self.task.done():
            self.handle = self.loop.call_at(now + self.budget, self._fire, now + self.budget)
        elif self.expired(self):
            self.fired = True
            assert self.task is not None
            self.task.cancel()
        else:
            self.handle = self.loop.call_at(now + self.budget, self._fire, now + self.budget)

    def cancel(self) -> None:
        self.handle.cancel()

    def caught(self) -> bool:
        """In an `except CancelledError`: whether this deadline caused it
        (then the cancellation is undone and the caller raises instead)."""
        if not self.fired:
            return False
        if sys.version_info >= (3, 11) and self.task is not None:
            self.task.uncancel()
        return True


def _lagging(d: _Deadline) -> bool:
    # The timer ran more than half a budget late: the event loop is behind,
    # and whatever the task waited for may have been ready long ago.
    return d.late > d.budget / 2


def _unread(conn: Any) -> bool:
    """Bytes of a reply are waiting: in the stream's buffer, or in the
    socket, not yet read by a loop that is behind."""
    reader = getattr(conn, "_reader", None)
    if reader is not None and getattr(reader, "_buffer", None):
        return True
    writer = getattr(conn, "_writer", None)
    sock = writer.get_extra_info("socket") if writer is not None else None
    if sock is None:
        return False
    try:
        ready, _, _ = select.select([sock.fileno()], [], [], 0)
    except (OSError, ValueError):
        return False
    return bool(ready)


def _no_reply(d: _Deadline) -> bool:
    # The command was written `budget` ago by the loop's clock. If any of
    # its reply is here, Redis answered and the loop is late: let the read
    # finish. Else Redis has not answered in time.
    return not _unread(d.conn)


class AsyncConnections:
    """The asyncio limiter's own connections to the client's server."""

    def __init__(self, pool: Any, settings: dict[str, Any], timeout: float) -> None:
        self._make: Callable[[], Any] = lambda: pool.connection_class(**settings)
        self.timeout = timeout
        self._idle: list[Any] = []
        self._all: list[Any] = []
        limit = _max_connections(pool)
        self._limit = limit
        self._gate: Optional[asyncio.Semaphore] = None

    async def call(self, args: tuple[Any, ...], timeout: Optional[float]) -> Any:
        budget = self.timeout if timeout is None else timeout
        gate = self._gate
        if gate is None and self._limit is not None:
            gate = self._gate = asyncio.Semaphore(self._limit)  # on the loop that uses it
        if gate is not None:
            if gate.locked():
                await self._wait_for_slot(gate, budget)
            else:
                await gate.acquire()  # free: returns at once
        try:
            try:
                conn = self._idle.pop()
            except IndexError:
                conn = self._make()
                self._all.append(conn)
            try:
                if not conn.is_connected:
                    await self._connect(conn, budget)
                # Straight to the stream and the parser: a few-byte command
                # never fills the socket (no drain to wait for), and the
                # checks and retries of redis-py's wrappers are the
                # limiter's own here.
                conn._writer.writelines(conn.pack_command(*args))
                deadline = _Deadline(budget, _no_reply, conn)
                try:
                    reply = await conn._parser.read_response()
                except asyncio.CancelledError:
                    if deadline.caught():
                        raise RedisTimeoutError(f"no reply from Redis within {budget} s of the command") from None
                    raise
                except OSError as exc:
                    raise ConnectionError(f"Error while reading from Redis: {exc}") from exc
                finally:
                    deadline.cancel()
                if isinstance(reply, ResponseError):
                    raise reply
            except ResponseError:
                self._idle.append(conn)
                raise
            except BaseException:
                await conn.disconnect(nowait=True)
                self._idle.append(conn)
                raise
            self._idle.append(conn)
            return reply
        finally:
            if gate is not None:
                gate.release()

    @staticmethod
    async def _wait_for_slot(gate: asyncio.Semaphore, budget: float) -> None:
        deadline = _Deadline(budget, lambda d: True)
        try:
            await gate.acquire()
        except asyncio.CancelledError:
            if deadline.caught():
                raise Shed(f"no connection to Redis free within {budget} s") from None
            raise
        finally:
            deadline.cancel()

    @staticmethod
    async def _connect(conn: Any, budget: float) -> None:
        # A busy loop polls its sockets late, so a connection that is not
        # up within the budget can't be blamed on Redis: that doubt sheds.
        # (A refused or reset connection fails at once; a frozen Redis still
        # accepts, and its silence is seen on the command's reply.)
        deadline = _Deadline(budget, lambda d: True)
        try:
            await conn.connect()
        except asyncio.CancelledError:
            if deadline.caught():
                await conn.disconnect(nowait=True)
                raise Shed(f"no connection to Redis up within {budget} s") from None
            raise
        finally:
            deadline.cancel()

    async def aclose(self) -> None:
        conns, self._all, self._idle = self._all, [], []
        for conn in conns:
            await conn.disconnect(nowait=True)


def async_connections(client: Any, timeout: Optional[float]) -> Optional[AsyncConnections]:
    if timeout is None or type(client) is not redis.asyncio.Redis or client.connection is not None:
        return None
    pool = client.connection_pool
    settings = _owned_settings(pool, timeout, sync=False)
    return None if settings is None else AsyncConnections(pool, settings, timeout)


async def bounded(awaitable: Any, budget: float) -> Any:
    """A client's own call (a Cluster, fakeredis, ...) under the limiter's
    timer. The limiter can't see into that call's connection, so a timer
    that ran late (the loop behind) is local overload, else Redis's."""
    deadline = _Deadline(budget, lambda d: True)
    try:
        return await awaitable
    except asyncio.CancelledError:
        if deadline.caught():
            if _lagging(deadline):
                raise Shed(f"the event loop fell {deadline.late:.3f} s behind the call") from None
            raise RedisTimeoutError(f"no answer from Redis within {budget} s") from None
        raise
    finally:
        deadline.cancel()


__all__ = [
    "AsyncConnections",
    "RedisError",
    "Shed",
    "SyncConnections",
    "async_connections",
    "bounded",
    "classify",
    "sync_connections",
]
