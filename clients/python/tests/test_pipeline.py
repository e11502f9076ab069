"""The asyncio limiter's own connection, shared by all tasks (issue 25):
the commands of one event-loop iteration go out in one send, replies are
read in order and each reaches its own command, whatever happens in
between: a frozen Redis, a command that timed out ahead of others, a
connection the server closes, a task cancelled. The failure model
(docs/failure-model.md) holds for each command."""

from __future__ import annotations

import asyncio
import time
from asyncio import selector_events
from typing import Any

import pytest
import redis
import redis.asyncio
from conftest import SLOW, Target, run
from tbservers import Server

import redis_tokenbucket.asyncio as tb_asyncio
from redis_tokenbucket import Bucket, Decision

N = 30


def buckets() -> list[tuple[str, Bucket]]:
    """Keys whose buckets differ in size by 10 tokens: a reply read for the
    wrong command shows as a `remaining` outside its own bucket's range."""
    return [(f"rl:pipe:{i}", Bucket(100 + 10 * i, SLOW)) for i in range(N)]


async def precharge(lim: tb_asyncio.Limiter, keys: list[tuple[str, Bucket]]) -> None:
    for key, bucket in keys:
        d = await lim.consume(key, bucket)
        assert d.allowed and not d.degraded and d.remaining == bucket.max - 1


@pytest.mark.parametrize("decode", [False, True], ids=["bytes", "decode_responses"])
def test_concurrent_calls_each_get_their_own_reply(target: Target, decode: bool):
    keys = buckets()

    async def main() -> list[Any]:
        client = target.async_client(decode_responses=decode)
        # A budget that a loaded machine can't miss: this test is about
        # which reply each call gets, not about deadlines.
        async with tb_asyncio.Limiter(client, timeout=5) as lim:
            await precharge(lim, keys)
            calls: list[Any] = []
            for i, (key, bucket) in enumerate(keys):
                if i % 3 == 0:
                    calls.append(lim.consume(key, bucket, 2))
                elif i % 3 == 1:
                    calls.append(lim.peek(key, bucket))
                else:
                    calls.append(lim.consume_many([(key, bucket, 3), (f"{key}:b", Bucket(7, SLOW))]))
            calls.insert(N // 2, lim.consume("rl:pipe:string", Bucket(5, SLOW)))  # an error reply amid the rest
            with target.admin() as admin:
                admin.set("rl:pipe:string", "x")
            out = await asyncio.gather(*calls, return_exceptions=True)
        await client.aclose()
        return out

    out = run(main())
    error = out.pop(N // 2)
    assert isinstance(error, redis.ResponseError)
    for i, ((_, bucket), d) in enumerate(zip(keys, out, strict=True)):
        assert not isinstance(d, BaseException), d
        assert d.allowed and not d.degraded
        if i % 3 == 0:
            assert d.remaining == bucket.max - 3
        elif i % 3 == 1:
            assert d.remaining == bucket.max - 1  # a peek charges nothing
        else:
            assert [x.remaining for x in d.decisions] == [bucket.max - 4, 6]


@pytest.fixture
def writes(module_target: Target, monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """What is written to the server, write by write, counted at the event
    loop's socket transport: each write is one send (a short one leaves
    nothing buffered for later)."""
    port = module_target.server.port
    out: list[bytes] = []
    write = selector_events._SelectorSocketTransport.write

    def counting(self: Any, data: Any) -> None:
        if self.get_extra_info("peername")[1] == port:
            out.append(bytes(data))
        write(self, data)

    monkeypatch.setattr(selector_events._SelectorSocketTransport, "write", counting)
    return out


def test_a_burst_from_many_tasks_goes_out_in_one_send(module_target: Target, writes: list[bytes]):
    keys = buckets()

    async def main() -> list[Decision]:
        client = module_target.async_client()
        async with tb_asyncio.Limiter(client) as lim:
            await lim.peek("rl:pipe:warm", Bucket(5, SLOW))  # connected
            writes.clear()
            # Each task runs up to its command in the same loop iteration.
            out = await asyncio.gather(*(lim.consume(key, bucket) for key, bucket in keys))
        await client.aclose()
        return list(out)

    out = run(main())
    assert [d.remaining for d in out] == [bucket.max - 1 for _, bucket in keys]
    assert sum(w.count(b"TB.CONSUME") for w in writes) == N
    assert len(writes) == 1


def test_replies_that_came_while_the_loop_was_busy_are_answers_not_failures(module_target: Target, writes: list[bytes]):
    """A burst is written, then the event loop is held for six budgets:
    when the timer finally runs, the replies wait in the socket, so Redis
    answered in time (the budget runs from the write), and each is read."""
    keys = buckets()

    async def main() -> list[Any]:
        client = module_target.async_client()
        async with tb_asyncio.Limiter(client, timeout=0.05, on_error="closed") as lim:
            await precharge(lim, keys)
            writes.clear()

            async def hold_the_loop_after_the_write() -> None:
                while not writes:
                    await asyncio.sleep(0)
                time.sleep(0.3)  # a CPU-bound request

            out = await asyncio.gather(
                *(lim.consume(key, bucket) for key, bucket in keys), hold_the_loop_after_the_write()
            )
        await client.aclose()
        return list(out[:-1])

    out = run(main())
    assert [(d.allowed, d.degraded, d.remaining) for d in out] == [(True, False, b.max - 2) for _, b in keys]


def test_a_frozen_redis_degrades_each_command_in_flight_and_misattributes_nothing(own_server: Server):
    keys = buckets()

    admin = own_server.client()  # one connection, for both counts

    def connections_received() -> int:
        return int(admin.info("stats")["total_connections_received"])

    async def main() -> tuple[list[Decision], list[Decision], int]:
        client = redis.asyncio.Redis(port=own_server.port)
        async with tb_asyncio.Limiter(client, timeout=0.2, on_error="open", breaker=False) as lim:
            await precharge(lim, keys)
            connections = connections_received()
            own_server.pause()
            try:
                frozen = await asyncio.gather(*(lim.consume(key, bucket) for key, bucket in keys))
            finally:
                own_server.resume()
            after = await asyncio.gather(*(lim.consume(key, bucket, timeout=5) for key, bucket in keys))
            connections = connections_received() - connections
        await client.aclose()
        return list(frozen), list(after), connections

    frozen, after, connections = run(main())
    assert all(d.allowed and d.degraded for d in frozen)
    # Nothing was written behind the commands that got no reply: the
    # calls after them went on one new connection.
    assert connections == 1
    admin.close()
    for (_, bucket), d in zip(keys, after, strict=True):
        assert d.allowed and not d.degraded
        # Each frozen command was written; Redis ran it or not when it woke
        # (its connection closed meanwhile): its own bucket either way.
        assert d.remaining in (bucket.max - 2, bucket.max - 3)


def test_replies_after_a_timed_out_command_still_reach_their_own_commands(own_server: Server):
    """Commands with a short and a long budget, interleaved in one send to
    a frozen Redis: the short ones time out (Redis failing), the long ones
    wait on; once Redis wakes, each long one gets its own reply, read past
    the short ones' replies on the same connection. Nothing is written
    behind a command that got no reply: a call after them opens another
    connection."""
    keys = buckets()
    admin = own_server.client()

    def connections_received() -> int:
        return int(admin.info("stats")["total_connections_received"])

    async def main() -> tuple[list[Decision], list[Decision], list[Decision], int]:
        client = redis.asyncio.Redis(port=own_server.port)
        async with tb_asyncio.Limiter(client, on_error="closed", breaker=False) as lim:
            await precharge(lim, keys)
            connections = connections_received()
            own_server.pause()
            try:
                calls = [
                    asyncio.ensure_future(lim.consume(key, bucket, timeout=0.2 if i % 2 == 0 else 30))
                    for i, (key, bucket) in enumerate(keys)
                ]
                short = await asyncio.gather(*calls[::2])
                later = asyncio.ensure_future(lim.consume("rl:pipe:later", Bucket(5, SLOW), timeout=30))
                await asyncio.sleep(0.05)  # written too
            finally:
                own_server.resume()
            long = await asyncio.gather(*calls[1::2], later)
            # The short ones ran when Redis woke, before the long ones behind them.
            again = await asyncio.gather(*(lim.peek(key, bucket) for key, bucket in keys[::2]))
            connections = connections_received() - connections
        await client.aclose()
        return list(short), list(long), list(again), connections

    short, long, again, connections = run(main())
    assert all(not d.allowed and d.degraded for d in short)
    later = long.pop()
    assert [(d.allowed, d.degraded, d.remaining) for d in long] == [(True, False, b.max - 2) for _, b in keys[1::2]]
    assert (later.allowed, later.degraded, later.remaining) == (True, False, 4)
    assert [(d.degraded, d.remaining) for d in again] == [(False, b.max - 2) for _, b in keys[::2]]
    assert connections == 1  # the later call's
    admin.close()


def test_a_connection_the_server_closes_fails_each_command_in_flight(module_target: Target):
    """CLIENT PAUSE WRITE holds the commands (written, unanswered), then
    CLIENT KILL closes the connection: each gets a Redis failure (its
    policy, or the ConnectionError), not a timeout, and not another's reply."""
    keys = buckets()

    async def main() -> tuple[list[Any], list[Decision]]:
        client = module_target.async_client()
        async with tb_asyncio.Limiter(client, timeout=30, breaker=False) as lim:
            await precharge(lim, keys)
            with module_target.admin() as admin:
                admin.client_pause(30_000, all=False)  # WRITE: TB.CONSUME waits
                try:
                    calls = [
                        asyncio.ensure_future(lim.consume(key, bucket, on_error="raise" if i % 2 else "closed"))
                        for i, (key, bucket) in enumerate(keys)
                    ]
                    while not any("b" in c["flags"] for c in admin.client_list()):
                        await asyncio.sleep(0.01)  # written, and held by the pause (blocked)
                    assert admin.client_kill_filter(_type="normal", skip_me=True) >= 1
                    out = await asyncio.gather(*calls, return_exceptions=True)
                finally:
                    admin.client_unpause()
            after = await asyncio.gather(*(lim.consume(key, bucket) for key, bucket in keys))
        await client.aclose()
        return list(out), list(after)

    out, after = run(main())
    for i, d in enumerate(out):
        if i % 2:
            assert type(d) is redis.ConnectionError, d
        else:
            assert isinstance(d, Decision) and not d.allowed and d.degraded and not d.shed
    # A new connection, and the killed commands never ran.
    assert [(d.allowed, d.degraded, d.remaining) for d in after] == [(True, False, b.max - 2) for _, b in keys]


def test_a_cancelled_task_never_shifts_the_replies_of_others(module_target: Target):
    """Some tasks are cancelled before their command is written (it is never
    sent), some after (Redis runs it, the reply is read and dropped); the
    others each get their own reply."""
    keys = buckets()
    before = set(range(0, N, 5))  # cancelled before the write
    after = set(range(2, N, 5)) | set(range(3, N, 5))  # cancelled while Redis holds the command

    async def main() -> tuple[list[Any], list[Decision]]:
        client = module_target.async_client()
        async with tb_asyncio.Limiter(client, timeout=30, breaker=False) as lim:
            await precharge(lim, keys)
            with module_target.admin() as admin:
                admin.client_pause(30_000, all=False)
                try:
                    calls = [asyncio.ensure_future(lim.consume(key, bucket)) for key, bucket in keys]

                    async def cancel_before_the_write() -> None:
                        # Runs after each call has handed its command over, in
                        # the same loop iteration, before the write.
                        for i in before:
                            calls[i].cancel()

                    await asyncio.gather(cancel_before_the_write(), asyncio.sleep(0.1))
                    for i in after:
                        calls[i].cancel()
                finally:
                    admin.client_unpause()
            out = await asyncio.gather(*calls, return_exceptions=True)
            peeks = await asyncio.gather(*(lim.peek(key, bucket) for key, bucket in keys))
        await client.aclose()
        return list(out), list(peeks)

    out, peeks = run(main())
    for i, ((_, bucket), d, p) in enumerate(zip(keys, out, peeks, strict=True)):
        if i in before:
            assert isinstance(d, asyncio.CancelledError) and p.remaining == bucket.max - 1, i
        elif i in after:
            assert isinstance(d, asyncio.CancelledError) and p.remaining == bucket.max - 2, i
        else:
            assert isinstance(d, Decision) and (d.allowed, d.degraded, d.remaining) == (True, False, bucket.max - 2)
            assert p.remaining == bucket.max - 2


# ---- the replies, as redis-py would have read them -------------------------------

REPLIES = [
    b":1\r\n",
    b":-42\r\n",
    b"$2\r\ntb\r\n",
    b"$0\r\n\r\n",
    b"$-1\r\n",
    b"$4\r\na\r\nb\r\n",  # a bulk string holding CRLF
    b"$3\r\n\xc3\xa9x\r\n",
    b"+OK\r\n",
    b"*4\r\n:1\r\n:99\r\n:0\r\n:10\r\n",
    b"*0\r\n",
    b"*-1\r\n",
    b"*3\r\n:1\r\n*2\r\n$1\r\na\r\n$-1\r\n-ERR inside\r\n",
    b"-NOSCRIPT No matching script. Please use EVAL.\r\n",
    b"-WRONGTYPE Operation against a key holding the wrong kind of value\r\n",
    b"-LOADING Redis is loading the dataset in memory\r\n",
    b"-READONLY You can't write against a read only replica.\r\n",
    b"-ERR max number of clients reached\r\n",
    b"-ERR invalid_argument field=cost\r\n",
]


def same(a: Any, b: Any) -> bool:
    if isinstance(a, BaseException):
        return type(a) is type(b) and a.args == b.args
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


@pytest.mark.parametrize("decode", [False, True])
def test_replies_parse_as_redis_py_parses_them(decode: bool):
    """The limiter's own RESP2 parser against redis-py's, on every kind of
    reply, whole and cut at every byte (a reply that arrives in pieces)."""
    from redis._parsers import _AsyncRESP2Parser
    from redis.asyncio.connection import Connection

    from redis_tokenbucket._transport import _parse

    conn = Connection(decode_responses=decode)
    stream = b"".join(REPLIES)

    async def theirs() -> list[Any]:
        reader = asyncio.StreamReader()
        reader.feed_data(stream)
        reader.feed_eof()
        parser = _AsyncRESP2Parser(65536)
        conn._reader = reader
        parser.on_connect(conn)
        out: list[Any] = []
        for _ in REPLIES:
            try:
                out.append(await parser.read_response())
            except redis.ConnectionError as exc:  # raised, where the others are returned
                out.append(exc)
        return out

    expected = run(theirs())
    decoder = conn.encoder.decode if decode else None
    error_class = conn._parser.parse_error
    ours: list[Any] = []
    pos = 0
    while pos < len(stream):
        reply, pos = _parse(stream, pos, decoder, error_class)
        ours.append(reply)
    assert len(ours) == len(expected) and all(same(a, b) for a, b in zip(ours, expected, strict=True)), ours
    for one, want in zip(REPLIES, expected, strict=True):
        for cut in range(len(one)):
            assert _parse(one[:cut], 0, decoder, error_class) == (None, -1)
        assert same(_parse(one, 0, decoder, error_class), (want, len(one)))


def test_a_limiter_serves_one_event_loop_after_another(module_target: Target):
    """Each asyncio.run() closes its loop, and with it the connection made
    there: the next loop gets a connection of its own."""
    lim = tb_asyncio.Limiter(module_target.async_client(max_connections=2), timeout=5)
    bucket = Bucket(100, SLOW)

    async def burst() -> list[int]:
        # More calls than the pool has connections: some wait for a slot.
        out = await asyncio.gather(*(lim.consume("rl:pipe:loops", bucket) for _ in range(10)))
        assert not any(d.degraded or d.shed for d in out)
        return sorted(d.remaining for d in out)

    assert run(burst()) == list(range(90, 100))
    assert run(burst()) == list(range(80, 90))
    run(lim.aclose())


def test_a_connection_not_up_within_the_budget_sheds_each_task_waiting_for_it(module_target: Target):
    """The tasks that find no connection share one connect; the event loop
    is held past their budget before it can see the connect finish: each
    is shed (local overload, whatever the policy), nothing was sent, and
    the breaker saw no failure."""
    keys = buckets()

    async def hold_the_loop() -> None:
        time.sleep(0.3)

    async def main() -> tuple[list[Any], str, list[Decision]]:
        client = module_target.async_client()
        async with tb_asyncio.Limiter(client, backend="module", timeout=0.05, on_error="open") as lim:
            out = await asyncio.gather(*(lim.consume(key, bucket) for key, bucket in keys), hold_the_loop())
            state = lim.breaker_state
            after = await asyncio.gather(*(lim.consume(key, bucket) for key, bucket in keys))
        await client.aclose()
        return list(out[:-1]), state, list(after)

    shed, state, after = run(main())
    assert all(not d.allowed and d.shed and not d.degraded for d in shed)
    assert state == "closed"
    assert [(d.allowed, d.degraded, d.remaining) for d in after] == [(True, False, b.max - 1) for _, b in keys]


@pytest.mark.parametrize("encoding", ["utf-8", "latin-1"])
def test_commands_pack_as_redis_py_packs_them(encoding: str):
    """The limiter's own packing (every command, sync and asyncio) against
    redis-py's pack_command, on the kinds of argument it sends and the
    ones only a client's encoder takes."""
    from redis.asyncio.connection import Connection as AsyncConnection
    from redis.connection import Connection

    from redis_tokenbucket._transport import _pack

    commands: list[tuple[Any, ...]] = [
        ("TB.CONSUME", "rl:user:7", "10.0", "0.17", "1.0"),
        ("FCALL", "tb_mconsume", 2, b"rl:{u}:a", "rl:{u}:é", "1e-05", "2", "3"),
        ("FUNCTION LOAD", "REPLACE", "#!lua name=tb\n" + "x" * 70_000),
        ("EVALSHA", "ab" * 20, 1, "k", "consume", -3, 0, 2**70, 1.5, memoryview(b"mv"), b""),
        ("FCALL_RO", "tb_version", 0),
        ("PING",),
    ]
    for conn in (Connection(encoding=encoding), AsyncConnection(encoding=encoding)):
        for args in commands:
            assert _pack(args, conn.encoder) == b"".join(conn.pack_command(*args)), args
        for bad in (True, None):
            with pytest.raises(redis.DataError):
                _pack(("TB.CONSUME", bad), conn.encoder)


def test_a_sync_reply_is_read_whole_however_it_arrives():
    """The sync limiter's reader on a socket that hands over a reply a byte
    at a time, then an error reply, then a connection closed mid-reply."""
    import socket
    import threading

    from redis.connection import Connection

    from redis_tokenbucket._transport import _exchange

    conn = Connection(socket_timeout=5)
    ours, theirs = socket.socketpair()
    conn._sock = ours
    replies = [b"*4\r\n:1\r\n:-2\r\n$3\r\nabc\r\n*-1\r\n", b"-NOSCRIPT No matching script\r\n", b"*2\r\n:1\r\n"]

    def server() -> None:
        for reply in replies:
            theirs.recv(65536)  # the command
            for i in range(len(reply)):
                theirs.sendall(reply[i : i + 1])
                time.sleep(0.001)
        theirs.shutdown(socket.SHUT_WR)

    thread = threading.Thread(target=server)
    thread.start()
    try:
        assert _exchange(conn, ours, ("TB.PEEK", "k", "1", "1"), 5) == [1, -2, b"abc", None]
        with pytest.raises(redis.exceptions.NoScriptError):
            _exchange(conn, ours, ("EVALSHA", "x", 0), 5)
        with pytest.raises(redis.ConnectionError, match="closed"):
            _exchange(conn, ours, ("TB.PEEK", "k", "1", "1"), 5)
    finally:
        thread.join()
        ours.close()
        theirs.close()


def test_a_sync_reply_not_come_within_the_budget_is_a_redis_timeout():
    import socket

    from redis.connection import Connection

    from redis_tokenbucket._transport import _exchange

    ours, theirs = socket.socketpair()
    ours.settimeout(0.05)
    try:
        with pytest.raises(redis.TimeoutError, match=r"within 0\.05 s"):
            _exchange(Connection(), ours, ("TB.PEEK", "k", "1", "1"), 0.05)
    finally:
        ours.close()
        theirs.close()
