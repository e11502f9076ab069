"""The asyncio limiter's own connection (see _transport): one redis-py
asyncio connection that all tasks' commands share, auto-pipelined.

The commands tasks hand over within one event-loop iteration are written
together, in one send (`_Pipe`'s writer task); one reader task reads the
replies (redis-py's `read_response`) and hands each to the next command in
the write order. A command's task never reads from the connection itself,
so a cancelled task can't leave a reply for another to misread.

Under load the event loop reads replies late: a reply that has come from
Redis is used however late it is read. A command fails as Redis's timeout
only when its budget, counted from its write, ran out with no reply in
sight: the pipe's watchdog then lets the loop poll its sockets once and
the reader read what came (`_Pipe._probe`) before it decides.

Nothing bounds the commands in flight but their budgets. Slots for them
(the pool's `max_connections`, as redis-py has one command in flight per
connection) only queued calls that a loop running behind could not serve
in time, and shed them (docs/benchmarks.md, the gateway under load).
Shedding happens before a command is sent, never after it: when no
connection is up within the budget, or a connection lost under a command
leaves too little of its budget to send it again.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Any, Optional

from redis.exceptions import ConnectionError, InvalidResponse, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ._classify import local_errno
from ._commands import Command, Once, Waited, waited_reply
from ._errors import LimiterError, Shed
from ._pack import pack

# Turns of the event loop between a watchdog's firing and its verdict. The
# timer runs after its iteration's poll of the sockets: the next iteration
# polls (what came before the timer fired, at the latest) and feeds it to
# the connection's stream after the turn queued in the timer's; the reader
# it wakes runs in the iteration after, after the turn queued then; the
# fourth turn comes after the reader.
_TURNS = 4


class _InFlight:
    """A command written on a pipe, its reply not read yet."""

    __slots__ = ("budget", "due", "extended", "future", "overdue", "reused")

    def __init__(self, future: asyncio.Future[Any], due: float, budget: float, reused: bool) -> None:
        self.future = future
        self.due = due  # by the loop's clock: the write, plus the budget
        self.budget = budget
        self.overdue = False  # no reply within the budget: the caller got a timeout
        self.extended = False  # given a second budget once (see _Pipe._probe)
        self.reused = reused  # the connection had answered before this write


class _Lost(Exception):
    """The pipe's connection went away before this command's reply (never
    leaves the module): `written` whether its bytes had been handed to the
    connection, `reused` whether that connection had answered before, `due`
    when its budget ends."""

    def __init__(self, error: BaseException, written: bool, reused: bool, due: Optional[float]) -> None:
        super().__init__(error)
        self.error, self.written, self.reused, self.due = error, written, reused, due

    def as_failure(self) -> ConnectionError:
        return ConnectionError(f"Error while talking to Redis: {self.error}")


class _Pipe:
    """One of the asyncio limiter's connections, shared by all tasks.

    One watchdog per pipe (not per command) watches the budgets, each from
    its command's write. A command that timed out retires the pipe: no new
    command is written behind it; those already written keep their own
    budgets and still get their own replies, in order, and the connection
    is closed once none is waited for."""

    def __init__(self, conn: Any, owner: AsyncConnections) -> None:
        self.conn = conn
        self.owner = owner
        self.loop = asyncio.get_running_loop()
        self.open = True  # takes new commands
        self.closed = False  # the connection is gone, or going
        self.replies = 0  # replies read so far
        self._queue: list[tuple[bytes, asyncio.Future[Any], float]] = []  # handed over, not written
        self._inflight: deque[_InFlight] = deque()
        self._timer: Optional[asyncio.TimerHandle] = None
        self._timer_due = 0.0
        self._wake: Optional[asyncio.Future[None]] = None
        owner.pipes.add(self)
        self._write_task = self.loop.create_task(self._write())
        self._read_task = self.loop.create_task(self._read())

    @property
    def tasks(self) -> tuple[asyncio.Task[None], asyncio.Task[None]]:
        return self._write_task, self._read_task

    def idle(self) -> bool:
        """Nothing handed over, nothing waiting for a reply."""
        return not self._queue and not self._inflight

    def send(self, packed: bytes, budget: float) -> asyncio.Future[Any]:
        """The command's reply, a future; written with the others of this
        loop iteration."""
        future = self.loop.create_future()
        self._queue.append((packed, future, budget))
        wake = self._wake
        if wake is not None and not wake.done():
            wake.set_result(None)
        return future

    async def _write(self) -> None:
        conn = self.conn
        inflight = self._inflight
        error: Optional[BaseException] = None
        try:
            while True:
                if not self._queue:
                    self._wake = self.loop.create_future()
                    await self._wake
                    continue
                queue, self._queue = self._queue, []
                if not conn.is_connected:  # closed under us: never let redis-py connect again here
                    raise ConnectionError("Connection to Redis lost before the command was written")
                now = self.loop.time()
                reused = self.replies > 0
                data: list[bytes] = []
                first: Optional[float] = None
                for packed, future, budget in queue:
                    if future.done():
                        continue  # its task was cancelled before the write: never sent
                    data.append(packed)
                    due = now + budget
                    inflight.append(_InFlight(future, due, budget, reused))
                    if first is None or due < first:
                        first = due
                if first is None:
                    continue
                if self._timer is None or first < self._timer_due:
                    self._arm(first)
                await conn.send_packed_command(data, check_health=False)
        except asyncio.CancelledError:
            pass  # closed: by the limiter, or by the reader finding the connection gone
        except Exception as exc:
            error = exc
        finally:
            if error is not None:
                self._gone(error)

    async def _read(self) -> None:
        read = self.conn.read_response
        inflight = self._inflight
        error: Optional[BaseException] = None
        try:
            while True:
                reply: Any
                try:
                    reply = await read()
                except ResponseError as exc:
                    reply = exc  # an error reply, read whole
                if not inflight:
                    raise InvalidResponse(f"a reply to no command: {reply!r}")
                future = inflight.popleft().future
                self.replies += 1
                if not future.done():
                    if isinstance(reply, ResponseError):
                        future.set_exception(reply)
                    else:
                        future.set_result(reply)
                if not self.open and self._settled():
                    return
        except asyncio.CancelledError:
            pass  # closed: by the limiter, or by the loop shutting down
        except Exception as exc:
            error = exc
        finally:
            if not self.loop.is_closed():  # else the loop was closed with this task pending: nothing runs
                self._gone(error)
                await self.conn.disconnect(nowait=True)

    # ---- the watchdog -------------------------------------------------------

    def _arm(self, due: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self.loop.call_at(due, self._expire)
        self._timer_due = due

    def _expire(self) -> None:
        self._timer = None
        if not self.closed:
            self._probe(self.replies, self.loop.time(), 1)

    def _probe(self, replies: int, fired: float, turn: int) -> None:
        """A budget ran out at `fired`. Before blaming Redis, the loop polls
        its sockets and the reader reads what came (a loop that is behind
        may not have looked for a while): a command still without a reply
        then was not answered within its budget, since the poll came after
        it. Once, if replies came meanwhile (more may wait, unread), it gets
        another budget; else, or the second time, it is Redis's timeout."""
        if self.closed:
            return
        if turn < _TURNS:
            self.loop.call_soon(self._probe, replies, fired, turn + 1)
            return
        now = self.loop.time()
        late = [c for c in self._inflight if not c.overdue and c.due <= fired]
        failed = False
        for c in late:
            if self.replies != replies and not c.extended:
                c.extended = True
                c.due = now + c.budget
                continue
            c.overdue = failed = True
            _fail(c.future, RedisTimeoutError(f"no reply from Redis within {c.budget:g} s of the command"))
        if failed:
            self.retire()
            if self._settled():
                self.close()
                return
        due = min((c.due for c in self._inflight if not c.overdue), default=None)
        if due is not None and (self._timer is None or due < self._timer_due):
            self._arm(due)

    # ---- the end ---------------------------------------------------------------

    def _settled(self) -> bool:
        """No command on it is waited for any more (each answered, timed
        out, or its task cancelled)."""
        return not self._queue and all(c.future.done() for c in self._inflight)

    def retire(self) -> None:
        """Takes no new commands from now on."""
        self.open = False
        if self.owner.pipe is self:
            self.owner.pipe = None

    def close(self) -> None:
        self.retire()
        if not self.loop.is_closed():
            for task in self.tasks:
                if not task.done():
                    task.cancel()

    def _gone(self, error: Optional[BaseException]) -> None:
        """The connection is closed, or closing: every command still waited
        for on it gets `_Lost` (its caller decides whether it may go again),
        or LimiterError if the limiter was closed."""
        if self.closed:
            return
        self.closed = True
        self.retire()
        self.owner.pipes.discard(self)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for task in self.tasks:
            if not task.done() and task is not asyncio.current_task():
                task.cancel()
        written, self._inflight = list(self._inflight), deque()
        queued, self._queue = self._queue, []
        for c in written:
            if error is None:
                _fail(c.future, LimiterError("the limiter is closed"))
            else:
                _fail(c.future, _Lost(error, True, c.reused, c.due))
        for _, future, _ in queued:
            _fail(future, LimiterError("the limiter is closed") if error is None else _Lost(error, False, True, None))


def _fail(future: asyncio.Future[Any], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)


async def _hear_of_closes() -> None:
    """Lets the loop poll its sockets and run what that brought (`_TURNS`):
    a connection the server closed before this call started is known
    closed when it returns, and one that came up is known up."""
    for _ in range(_TURNS):
        await asyncio.sleep(0)


class AsyncConnections:
    """The asyncio limiter's own connection(s) to the client's server: one
    pipe that all tasks' commands share (another once it is retired or
    lost)."""

    def __init__(self, make: Callable[[], Any], timeout: float) -> None:
        self._make = make
        self.timeout = timeout
        self.pipe: Optional[_Pipe] = None  # the one new commands go on
        self.pipes: set[_Pipe] = set()  # with tasks running: the current one and retired ones
        self._opening: Optional[asyncio.Future[_Pipe]] = None
        self._opening_waiters = 0

    async def call(self, command: Command, timeout: Optional[float]) -> Any:
        budget = self.timeout if timeout is None else timeout
        loop = asyncio.get_running_loop()
        once = type(command) is Once
        args: Any = command.command if once else command  # type: ignore[union-attr]
        try:
            return await self._send(args, once, budget, loop)
        except _Lost as lost:
            if (lost.written and (once or not lost.reused)) or local_errno(lost.error) is not None:
                raise lost.as_failure() from lost.error
            # Closed by the server while idle (EOF or a reset before any
            # reply): once more on a new connection, within the same budget.
            remaining = budget if lost.due is None else lost.due - loop.time()
            if remaining <= 0:
                raise Shed("Redis closed the connection; this process heard of it too late to send again") from None
        try:
            return await self._send(args, once, remaining, loop)
        except _Lost as lost:
            raise lost.as_failure() from lost.error

    async def _send(self, args: Any, once: bool, budget: float, loop: asyncio.AbstractEventLoop) -> Any:
        """The command on the pipe; its reply, or `_Lost`."""
        pipe = self.pipe
        if pipe is None or pipe.loop is not loop:
            pipe = await self._open(budget)
        elif once and pipe.idle():
            # A refund may go again only if it never reached Redis: on a
            # connection found closed before it is written, not after.
            await _hear_of_closes()
            pipe = self.pipe if self.pipe is not None and self.pipe.loop is loop else await self._open(budget)
        if type(args) is not Waited:
            return await pipe.send(pack(args, pipe.conn.encoder), budget)
        # The command and WAIT, written together; both replies are read
        # (an error reply too) before either is raised.
        sent = (
            pipe.send(pack(args.command, pipe.conn.encoder), budget),
            pipe.send(pack(args.wait, pipe.conn.encoder), budget),
        )
        replies = await asyncio.gather(*sent, return_exceptions=True)
        for reply in replies:
            if isinstance(reply, _Lost):
                raise reply
        return waited_reply(replies)

    async def _open(self, budget: float) -> _Pipe:
        """The pipe, connected: one connect for all the tasks that need it.
        A busy loop polls its sockets late, so a connection that is not up
        within the budget can't be blamed on Redis: that doubt sheds. (A
        refused or reset connection fails at once; a frozen Redis still
        accepts, and its silence is seen on the command's reply.)"""
        opening = self._opening
        if opening is None or opening.get_loop() is not asyncio.get_running_loop():
            opening = self._opening = asyncio.ensure_future(self._connect())
            opening.add_done_callback(self._opened)
        self._opening_waiters += 1
        try:
            try:
                return await asyncio.wait_for(asyncio.shield(opening), budget)
            except asyncio.TimeoutError:
                # A connect that finished while the loop was behind is used.
                await _hear_of_closes()
                if not opening.done():
                    raise Shed(f"no connection to Redis up within {budget:g} s") from None
                return opening.result()
        finally:
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
        pipe = self.pipe = _Pipe(conn, self)
        return pipe

    async def aclose(self) -> None:
        if self._opening is not None:
            self._opening.cancel()
        pipes = list(self.pipes)
        self.pipe = None
        for pipe in pipes:
            pipe.close()
        loop = asyncio.get_running_loop()
        await asyncio.gather(*(t for p in pipes if p.loop is loop for t in p.tasks), return_exceptions=True)


async def bounded(awaitable: Any, budget: float) -> Any:
    """A client's own call (a Cluster, fakeredis, ...) under the limiter's
    budget. The limiter can't see into that call's connection: when the
    budget runs out, the loop polls its sockets once more, and an answer
    that came is used; else a timer that ran late (the loop behind) is
    local overload, and one on time is Redis's timeout."""
    loop = asyncio.get_running_loop()
    call = asyncio.ensure_future(awaitable)
    due = loop.time() + budget
    try:
        done, _ = await asyncio.wait((call,), timeout=budget)
        if not done:
            late = loop.time() - due
            await _hear_of_closes()
            if not call.done():
                call.cancel()
                if late > budget / 2:
                    raise Shed(f"the event loop fell {late:.3f} s behind the call")
                raise RedisTimeoutError(f"no answer from Redis within {budget:g} s")
        return call.result()
    except asyncio.CancelledError:
        call.cancel()
        raise


__all__ = ["AsyncConnections", "bounded"]
