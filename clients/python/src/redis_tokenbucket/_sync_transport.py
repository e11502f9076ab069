"""The sync limiter's own connections (see _transport): redis-py
connections whose socket timeout is the budget, so no thread watches a
call, and a command that gets no reply in time closes its connection (a
late reply is never read as another command's)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, Optional

from redis.exceptions import ConnectionError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ._classify import local_errno
from ._commands import Command, Once, Waited, waited_reply
from ._errors import Shed
from ._pack import pack


class _Owned:
    """One of the limiter's connections, and whether it is up: connected,
    and every exchange on it so far ended with a whole reply."""

    __slots__ = ("conn", "up")

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.up = False


class SyncConnections:
    """The sync limiter's own connections to the client's server, at most
    the client pool's `max_connections` of them in use at once (waiting for
    one is bounded by the budget, and running out of it sheds)."""

    def __init__(self, make: Callable[[], Any], timeout: float, limit: Optional[int]) -> None:
        self._make = make
        self.timeout = timeout
        self._idle: list[_Owned] = []
        self._all: list[_Owned] = []
        self._lock = threading.Lock()
        self._gate = threading.BoundedSemaphore(limit) if limit else None

    @property
    def gate(self) -> Optional[threading.BoundedSemaphore]:
        """One slot per connection (None for an unbounded pool)."""
        return self._gate

    def call(self, command: Command, timeout: Optional[float]) -> Any:
        budget = self.timeout if timeout is None else timeout
        gate = self._gate
        if gate is not None and not gate.acquire(timeout=budget):
            raise Shed(f"no connection to Redis free within {budget} s")
        try:
            try:
                owned = self._idle.pop()
            except IndexError:
                owned = _Owned(self._make())
                with self._lock:
                    self._all.append(owned)
            try:
                return self._exchange(owned, command, budget)
            finally:
                self._idle.append(owned)
        finally:
            if gate is not None:
                gate.release()

    def _exchange(self, owned: _Owned, command: Command, budget: float) -> Any:
        once = type(command) is Once
        args: Any = command.command if once else command  # type: ignore[union-attr]
        conn = owned.conn
        started = time.monotonic()
        reused = owned.up
        if not reused:
            conn.connect()
            owned.up = True
        elif once and _closed_while_idle(conn):
            # Found closed before anything was written: a new connection is
            # safe for any command, a refund too.
            conn.disconnect()
            owned.up = False
            conn.connect()
            owned.up = True
            reused = False
        if type(args) is Waited:  # the command and WAIT, in one write
            packed = [pack(args.command, conn.encoder), pack(args.wait, conn.encoder)]
        else:
            packed = [pack(args, conn.encoder)]  # a list: the sync send_packed_command sends each item
        try:
            return self._roundtrip(conn, packed, budget)
        except ResponseError:
            raise  # an error reply, read whole: the connection is fine
        except ConnectionError as exc:
            owned.up = False
            conn.disconnect()
            # EOF or a reset before any reply, on a connection that had been
            # answering: the server (or a load balancer) closed it while it
            # sat idle. Once more on a new one, within the same budget,
            # unless a second run could mint (a refund: it may have run).
            if not reused or once or local_errno(exc) is not None:
                raise
            remaining = started + budget - time.monotonic()
            if remaining <= 0:
                raise
            conn.connect()
            owned.up = True
        except BaseException:
            owned.up = False
            conn.disconnect()  # nothing of this command may be read later
            raise
        try:
            return self._roundtrip(conn, packed, remaining)
        except ResponseError:
            raise
        except BaseException:
            owned.up = False
            conn.disconnect()
            raise

    def _roundtrip(self, conn: Any, packed: list[bytes], budget: float) -> Any:
        conn.send_packed_command(packed, check_health=False)
        if len(packed) > 1:
            return waited_reply(self._replies(conn, len(packed), budget))
        # The socket's timeout is the limiter's; another budget waits for
        # the reply's first bytes itself.
        if budget != self.timeout and not conn.can_read(budget):
            raise RedisTimeoutError(f"no reply from Redis within {budget:g} s of the command")
        return conn.read_response()

    def _replies(self, conn: Any, count: int, budget: float) -> list[Any]:
        """The replies of commands written together, each read whole (an
        error reply as its exception) so none is left on the connection."""
        deadline = time.monotonic() + budget
        replies: list[Any] = []
        for _ in range(count):
            if not conn.can_read(max(deadline - time.monotonic(), 0)):
                raise RedisTimeoutError(f"no reply from Redis within {budget:g} s of the command")
            try:
                replies.append(conn.read_response())
            except ResponseError as exc:
                replies.append(exc)
        return replies

    def close(self) -> None:
        with self._lock:
            owned, self._all, self._idle = self._all, [], []
        for o in owned:
            o.conn.disconnect()


def _closed_while_idle(conn: Any) -> bool:
    """Whether an idle connection has been closed by the server (EOF or a
    reset waiting in its socket), or holds bytes nobody asked for."""
    try:
        return bool(conn.can_read(0))
    except ConnectionError:
        return True
