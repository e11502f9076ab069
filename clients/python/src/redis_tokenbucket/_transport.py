"""How a command reaches Redis, and how a failure of Redis is told apart
from the gateway being busy (docs/failure-model.md).

For a plain ``redis.Redis`` / ``redis.asyncio.Redis`` the limiter keeps its
own connections, made from the client's connection settings, so that:

- the budget (`timeout`) runs from the moment the command is written:
  the sync limiter rides the socket's own timeout (no thread), the
  asyncio limiter has one timer per connection, watching each command's
  budget from its write;
- redis-py's retries (and their backoff) can't multiply the budget: these
  connections never retry, the limiter and its breaker decide;
- waiting for a connection (sync: all of them busy; asyncio: as many
  commands in flight as the client's pool has connections) is bounded by
  the same budget and, when it runs out, is local overload (`Shed`),
  never a Redis failure;
- a late reply is never read as the answer to another command: the sync
  limiter closes a connection whose command got no answer; the asyncio
  one reads each connection's replies in order, one reader per
  connection, and writes nothing more behind a command that got none.

The asyncio limiter's tasks share one connection (`_Pipe`): the commands
they send within one event-loop iteration go out in one write, as
auto-pipelining clients do: many tasks, one send.

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
from collections import deque
from collections.abc import Callable
from typing import Any, Optional

import redis
import redis.asyncio
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.exceptions import (
    ConnectionError,
    InvalidResponse,
    RedisError,
    ResponseError,
)
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

from ._classify import classify
from ._errors import LimiterError, Shed

# redis-py 7.1+ names the client to the server with a DriverInfo.
_DRIVER_INFO = importlib.util.find_spec("redis.driver_info") is not None

# A pool bigger than this is unbounded (redis-py 5's default is 2**31).
_UNBOUNDED = 2**30


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
    if settings.get("protocol") is None or not sync:
        # RESP2 unless the sync client asked for 3: redis-py 8 defaults to
        # 3, whose HELLO is a round trip on every connect; the replies the
        # limiter reads (arrays of integers) are the same in both. The
        # asyncio limiter parses its replies itself (`_parse`), in RESP2.
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
        sock = conn._sock
        if budget == self.timeout:
            return _exchange(conn, sock, args, budget)
        # Another budget for this call: the socket's timeout, put back after.
        sock.settimeout(budget)
        try:
            return _exchange(conn, sock, args, budget)
        finally:
            if conn._sock is sock:
                sock.settimeout(self.timeout)

    def close(self) -> None:
        with self._lock:
            conns, self._all, self._idle = self._all, [], []
        for conn in conns:
            conn.disconnect()


def _exchange(conn: Any, sock: Any, args: tuple[Any, ...], budget: float) -> Any:
    """Writes one command on a limiter's own connection (redis-py connected
    it) and reads its reply, packed and parsed here (`_pack`, `_parse`):
    the socket's timeout is the budget."""
    encoder = conn.encoder
    decode = encoder.decode if encoder.decode_responses else None
    try:
        sock.sendall(_pack(args, encoder))
        buffer = b""
        while True:
            data = sock.recv(_READ_SIZE)
            if not data:
                raise ConnectionError("Connection closed by server.")
            buffer += data
            reply, end = _parse(buffer, 0, decode, conn._parser.parse_error)
            if end >= 0:
                break
    except TimeoutError:
        raise RedisTimeoutError(f"no reply from Redis within {budget} s of the command") from None
    except OSError as exc:
        raise ConnectionError(f"Error while talking to Redis: {exc}") from exc
    if end != len(buffer):
        raise InvalidResponse(f"bytes after the reply: {buffer[end:]!r}")
    if isinstance(reply, Exception):  # an error reply, read whole
        raise reply
    return reply


def sync_connections(client: Any, timeout: Optional[float]) -> Optional[SyncConnections]:
    if timeout is None or type(client) is not redis.Redis or client.connection is not None:
        return None
    pool = client.connection_pool
    settings = _owned_settings(pool, timeout, sync=True)
    return None if settings is None else SyncConnections(pool, settings, timeout)


# ---- asyncio -----------------------------------------------------------------


class _Deadline:
    """One timer for one wait of one task (for a connection slot, for a
    connection, for a client's own call): when it fires, the task is
    cancelled, unless its wait is already over."""

    __slots__ = ("budget", "fired", "handle", "late", "loop", "task")

    def __init__(self, budget: float) -> None:
        self.loop = asyncio.get_running_loop()
        self.task = asyncio.current_task()
        self.budget = budget
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
        elif self.task is not None:
            self.fired = True
            self.task.cancel()

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


class _InFlight:
    """A command written on a pipe, its reply not read yet."""

    __slots__ = ("budget", "due", "future", "overdue")

    def __init__(self, future: asyncio.Future[Any], due: float, budget: float) -> None:
        self.future = future
        self.due = due  # by the loop's clock: the write, plus the budget
        self.budget = budget
        self.overdue = False  # no reply within the budget: the caller got a timeout


class _Pipe:
    """One of the asyncio limiter's connections, shared by all tasks.

    The commands tasks hand it within one event-loop iteration are written
    together, in one send, when the iteration's callbacks run. Redis
    answers a connection's commands in the order it read them, so one
    reader task reads the replies and hands each to the next command in
    the write order (FIFO): a command's task never reads from the socket
    itself, so a cancelled task can't leave a reply for another to misread.

    One timer per pipe (not per command) watches the budgets, each from its
    command's write: it runs at the earliest due, and a command still
    without a reply then is Redis's failure, unless bytes of a reply wait
    to be read (the loop is behind: Redis answered, wait on). A command
    that timed out retires the pipe: no new command is written behind it;
    those already written keep their own budgets and still get their own
    replies, in order, and the connection is closed once none is waited for.
    """

    def __init__(self, conn: Any, owner: AsyncConnections) -> None:
        self.conn = conn
        self.owner = owner
        self.loop = asyncio.get_running_loop()
        self.open = True  # takes new commands
        self.closed = False  # the connection is gone, or going
        self._queue: list[tuple[bytes, asyncio.Future[Any], float]] = []  # handed over, not written
        self._inflight: deque[_InFlight] = deque()
        self._timer: Optional[asyncio.TimerHandle] = None
        self._timer_due = 0.0
        self._partial = b""  # the start of a reply, the rest still to come
        owner._pipes.add(self)
        self._reader = self.loop.create_task(self._read())

    def send(self, packed: bytes, budget: float) -> asyncio.Future[Any]:
        """The command's reply, a future; written with the others of this
        loop iteration."""
        future = self.loop.create_future()
        if not self._queue:
            self.loop.call_soon(self._flush)
        self._queue.append((packed, future, budget))
        return future

    def _flush(self) -> None:
        queue, self._queue = self._queue, []
        if self.closed:
            for _, future, _ in queue:
                _fail(future, ConnectionError("Connection to Redis lost before the command was written"))
            return
        now = self.loop.time()
        data: list[bytes] = []
        inflight = self._inflight
        first = None
        for packed, future, budget in queue:
            if future.done():
                continue  # its task was cancelled before the write: never sent
            data.append(packed)
            due = now + budget
            inflight.append(_InFlight(future, due, budget))
            if first is None or due < first:
                first = due
        if first is None:
            return
        self.conn._writer.write(b"".join(data))  # a lost connection drops it; the reader fails these
        if self._timer is None or first < self._timer_due:
            self._arm(first)

    def _arm(self, due: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self.loop.call_at(due, self._expire)
        self._timer_due = due

    def _expire(self) -> None:
        self._timer = None
        if self.closed:
            return
        now = self.loop.time()
        # A cancelled task's command is watched too: Redis not answering it
        # in time retires the pipe as well.
        late = [c for c in self._inflight if not c.overdue and c.due <= now]
        if late:
            if self._bytes_waiting():
                # Bytes of replies wait to be read: Redis answered, the
                # event loop is behind. Each gets another budget.
                for c in late:
                    c.due = now + c.budget
            else:
                for c in late:
                    c.overdue = True
                    if not c.future.done():
                        error = RedisTimeoutError(f"no reply from Redis within {c.budget} s of the command")
                        c.future.set_exception(error)
                self.retire()
                if self._settled():
                    self.close()
                    return
        due = min((c.due for c in self._inflight if not c.overdue), default=None)
        if due is not None:
            self._arm(due)

    def _bytes_waiting(self) -> bool:
        """Bytes of a reply have come and wait to be read, by a loop that is
        behind: part of a reply in the reader's hands, or bytes in the
        stream's buffer, or in the socket."""
        if self._partial or getattr(self.conn._reader, "_buffer", None):
            return True
        sock = self.conn._writer.get_extra_info("socket")
        if sock is None:
            return False
        try:
            if hasattr(select, "poll"):  # no limit on the descriptor's number, as select() has
                poll = select.poll()
                poll.register(sock.fileno(), select.POLLIN)
                return bool(poll.poll(0))
            return bool(select.select([sock.fileno()], [], [], 0)[0])
        except (OSError, ValueError):
            return False

    def _settled(self) -> bool:
        """No command on it is waited for any more (each answered, timed
        out, or its task cancelled)."""
        return not self._queue and all(c.future.done() for c in self._inflight)

    def retire(self) -> None:
        """Takes no new commands from now on."""
        self.open = False
        if self.owner._pipe is self:
            self.owner._pipe = None

    def close(self) -> None:
        self.retire()
        if not self._reader.done() and not self.loop.is_closed():
            self._reader.cancel()

    async def _read(self) -> None:
        stream = self.conn._reader
        encoder = self.conn.encoder
        decode = encoder.decode if encoder.decode_responses else None
        error_class = self.conn._parser.parse_error  # redis-py's error classes (NoScriptError, ...)
        inflight = self._inflight
        error: Optional[BaseException] = None
        try:
            while True:
                data = await stream.read(_READ_SIZE)
                if not data:
                    raise ConnectionError("Connection closed by server.")
                buffer = self._partial + data if self._partial else data
                pos = 0
                while True:
                    reply, end = _parse(buffer, pos, decode, error_class)
                    if end < 0:
                        break  # the rest of this reply is still to come
                    pos = end
                    if not inflight:
                        raise InvalidResponse(f"a reply to no command: {reply!r}")
                    future = inflight.popleft().future
                    if not future.done():
                        if isinstance(reply, Exception):  # an error reply
                            future.set_exception(reply)
                        else:
                            future.set_result(reply)
                    if not self.open and self._settled():
                        return
                self._partial = buffer[pos:]
        except asyncio.CancelledError:
            pass  # closed: by the limiter, or by the loop shutting down
        except Exception as exc:
            error = exc
        finally:
            self.owner._pipes.discard(self)
            if not self.loop.is_closed():  # else the loop was closed with this task pending: nothing runs
                self._gone(error)
                await self.conn.disconnect(nowait=True)

    def _gone(self, error: Optional[BaseException]) -> None:
        """The connection is closed: every command still waited for on it
        fails (a Redis failure, unless the limiter was closed)."""
        self.closed = True
        self.retire()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        waiting = [c.future for c in self._inflight] + [f for _, f, _ in self._queue]
        self._inflight.clear()
        self._queue.clear()
        for future in waiting:
            if future.done():
                continue
            if error is None:
                _fail(future, LimiterError("the limiter is closed"))
            else:
                _fail(future, ConnectionError(f"Error while reading from Redis: {error}"), error)


_READ_SIZE = 65536
_INCOMPLETE: tuple[Any, int] = (None, -1)


def _pack(args: tuple[Any, ...], encoder: Any) -> bytes:
    """One command in RESP, the bytes redis-py's pack_command sends for it:
    the first argument's words as separate arguments ("FUNCTION LOAD"),
    str encoded as the client encodes it, an int as its decimal text, and
    anything else through the client's encoder (which refuses a bool or
    None). Without redis-py's calls per argument: every command is packed."""
    words = args[0].encode().split()
    parts = [b"*%d\r\n" % (len(words) + len(args) - 1)]
    for word in words:
        parts.append(b"$%d\r\n%s\r\n" % (len(word), word))
    encoding, errors = encoder.encoding, encoder.encoding_errors
    for arg in args[1:]:
        kind = type(arg)
        if kind is str:
            data = arg.encode(encoding, errors)
        elif kind is bytes:
            data = arg
        elif kind is int:
            data = b"%d" % arg
        else:
            data = encoder.encode(arg)
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


def _parse(
    buf: bytes, pos: int, decode: Optional[Callable[[bytes], Any]], error_class: Callable[[str], Exception]
) -> tuple[Any, int]:
    """One RESP2 reply at `pos`: (the reply, where the next starts), or
    (None, -1) while it is incomplete. The values are redis-py's: bytes
    (str with decode_responses), int, None, lists, an error reply as the
    exception redis-py would make of it (NoScriptError, ...). The
    limiter's connections speak RESP2 (`_owned_settings`), and parse here
    all the replies a read brings, without a coroutine per line."""
    end = buf.find(b"\r\n", pos)
    if end < 0:
        return _INCOMPLETE
    kind = buf[pos]
    if kind == 58:  # ":" an integer
        return int(buf[pos + 1 : end]), end + 2
    if kind == 42:  # "*" an array
        count = int(buf[pos + 1 : end])
        if count < 0:
            return None, end + 2
        items = []
        at = end + 2
        for _ in range(count):
            item, at = _parse(buf, at, decode, error_class)
            if at < 0:
                return _INCOMPLETE
            items.append(item)
        return items, at
    if kind == 36:  # "$" a bulk string
        size = int(buf[pos + 1 : end])
        if size < 0:
            return None, end + 2
        start = end + 2
        if len(buf) < start + size + 2:
            return _INCOMPLETE
        value = buf[start : start + size]
        return (decode(value) if decode else value), start + size + 2
    if kind == 43:  # "+" a simple string
        value = buf[pos + 1 : end]
        return (decode(value) if decode else value), end + 2
    if kind == 45:  # "-" an error
        return error_class(buf[pos + 1 : end].decode("utf-8", errors="replace")), end + 2
    raise InvalidResponse(f"Protocol Error: {buf[pos:end]!r}")


def _fail(future: asyncio.Future[Any], exc: BaseException, cause: Optional[BaseException] = None) -> None:
    if not future.done():
        exc.__cause__ = cause
        future.set_exception(exc)


class AsyncConnections:
    """The asyncio limiter's own connection(s) to the client's server: one
    pipe that all tasks' commands share (another once it is retired or
    lost). The client pool's `max_connections`, which bounds the commands
    redis-py has in flight (one per connection), bounds the limiter's
    commands in flight the same way; waiting for one of those slots is
    bounded by the budget, and running out of it sheds."""

    def __init__(self, pool: Any, settings: dict[str, Any], timeout: float) -> None:
        self._make: Callable[[], Any] = lambda: pool.connection_class(**settings)
        self.timeout = timeout
        self._pipe: Optional[_Pipe] = None
        self._pipes: set[_Pipe] = set()  # with a reader running: the current one and retired ones
        self._opening: Optional[asyncio.Future[_Pipe]] = None
        self._opening_waiters = 0
        self._limit = _max_connections(pool)
        self._gate: Optional[asyncio.Semaphore] = None
        self._gate_loop: Optional[asyncio.AbstractEventLoop] = None

    async def call(self, args: tuple[Any, ...], timeout: Optional[float]) -> Any:
        budget = self.timeout if timeout is None else timeout
        loop = asyncio.get_running_loop()
        gate = self._gate
        if self._limit is not None and (gate is None or self._gate_loop is not loop):
            gate = self._gate = asyncio.Semaphore(self._limit)  # one per loop: a semaphore waits on one
            self._gate_loop = loop
        if gate is not None:
            if gate.locked():
                await _wait_for_slot(gate, budget)
            else:
                await gate.acquire()  # free: returns at once
        try:
            pipe = self._pipe
            if pipe is None or pipe.loop is not loop:
                pipe = await self._open(budget)
            future = pipe.send(_pack(args, pipe.conn.encoder), budget)
            try:
                return await future
            except asyncio.CancelledError:
                if future.done() and not future.cancelled():
                    future.exception()  # answered, but its task is gone: nobody reads it
                raise
        finally:
            if gate is not None:
                gate.release()

    async def _open(self, budget: float) -> _Pipe:
        """The pipe, connected: one connect for all the tasks that need it."""
        opening = self._opening
        if opening is None or opening.get_loop() is not asyncio.get_running_loop():
            opening = self._opening = asyncio.ensure_future(self._connect())
            opening.add_done_callback(self._opened)
        self._opening_waiters += 1
        # A busy loop polls its sockets late, so a connection that is not
        # up within the budget can't be blamed on Redis: that doubt sheds.
        # (A refused or reset connection fails at once; a frozen Redis still
        # accepts, and its silence is seen on the command's reply.)
        deadline = _Deadline(budget)
        try:
            return await asyncio.shield(opening)
        except asyncio.CancelledError:
            if deadline.caught():
                raise Shed(f"no connection to Redis up within {budget} s") from None
            raise
        finally:
            deadline.cancel()
            self._opening_waiters -= 1
            if not self._opening_waiters and not opening.done():
                opening.cancel()  # nobody waits for it any more

    def _opened(self, opening: asyncio.Future[_Pipe]) -> None:
        if self._opening is opening:
            self._opening = None
        if not opening.cancelled():
            opening.exception()  # its waiters have it; none may be left

    async def _connect(self) -> _Pipe:
        conn = self._make()
        try:
            await conn.connect()
        except BaseException:
            await conn.disconnect(nowait=True)
            raise
        pipe = self._pipe = _Pipe(conn, self)
        return pipe

    async def aclose(self) -> None:
        if self._opening is not None:
            self._opening.cancel()
        pipes = list(self._pipes)
        self._pipe = None
        for pipe in pipes:
            pipe.close()
        loop = asyncio.get_running_loop()
        await asyncio.gather(*(p._reader for p in pipes if p.loop is loop), return_exceptions=True)


async def _wait_for_slot(gate: asyncio.Semaphore, budget: float) -> None:
    deadline = _Deadline(budget)
    try:
        await gate.acquire()
    except asyncio.CancelledError:
        if deadline.caught():
            raise Shed(f"no connection to Redis free within {budget} s") from None
        raise
    finally:
        deadline.cancel()


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
    deadline = _Deadline(budget)
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
