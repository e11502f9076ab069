"""The asyncio limiter's own connection, shared by all tasks:
the commands of one event-loop iteration go out in one send, replies are
read in order and each reaches its own command, whatever happens in
between: a frozen Redis, a command that timed out ahead of others, a
connection the server closes, a task cancelled. The failure model
(docs/failure-model.md) holds for each command."""

from __future__ import annotations

import asyncio
import time
from asyncio import selector_events
from collections.abc import Callable
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


def blocked(admin: redis.Redis) -> set[str]:
    """The ids of the clients the server holds blocked (CLIENT PAUSE WRITE)."""
    return {c["id"] for c in admin.client_list() if "b" in c["flags"]}


async def until(condition: Callable[[], bool], what: str, seconds: float = 10) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"not seen within {seconds} s: {what}"
        await asyncio.sleep(0.01)


def kill_the_connection_in_flight(module_target: Target, keys: list[tuple[str, Bucket]], kills: int) -> list[Any]:
    """CLIENT PAUSE WRITE holds the commands (written, unanswered), then
    CLIENT KILL closes the connection (a connection that had answered
    before), `kills` times; the commands: charges, and every fifth a refund."""

    async def main() -> list[Any]:
        client = module_target.async_client()
        async with tb_asyncio.Limiter(client, timeout=30, breaker=False) as lim:
            await precharge(lim, keys)
            with module_target.admin() as admin:
                admin.client_pause(30_000, all=False)  # WRITE: TB.CONSUME and TB.ADJUST wait
                try:
                    calls = [
                        asyncio.ensure_future(
                            lim.adjust(key, bucket, 1, on_error="closed")
                            if i % 5 == 4
                            else lim.consume(key, bucket, on_error="raise" if i % 2 else "closed")
                        )
                        for i, (key, bucket) in enumerate(keys)
                    ]
                    killed: set[str] = set()

                    def held() -> bool:  # a connection not killed yet, its commands held by the pause
                        return bool(blocked(admin) - killed)

                    for _ in range(kills):
                        await until(held, "commands written and held by the pause")
                        killed |= blocked(admin)
                        assert admin.client_kill_filter(_type="normal", skip_me=True) >= 1
                    if kills == 1:
                        await until(held, "the charges sent again, and held")
                finally:
                    admin.client_unpause()
                out = await asyncio.gather(*calls, return_exceptions=True)
            after = await asyncio.gather(*(lim.peek(key, bucket) for key, bucket in keys))
        await client.aclose()
        return list(zip(out, after, strict=True))

    return run(main())


def test_charges_of_a_connection_the_server_closes_go_once_more(module_target: Target):
    """Each charge goes once more on a new connection and gets its own
    answer from Redis (the killed ones never ran: charged once); a refund,
    which might have run, is not sent again: Redis failing (its policy)."""
    keys = buckets()
    answers = kill_the_connection_in_flight(module_target, keys, 1)
    for i, ((_, bucket), (d, after)) in enumerate(zip(keys, answers, strict=True)):
        if i % 5 == 4:
            assert isinstance(d, Decision) and not d.allowed and d.degraded, (i, d)
            assert after.remaining == bucket.max - 1, i  # it never ran
        else:
            assert isinstance(d, Decision) and (d.allowed, d.degraded, d.remaining) == (True, False, bucket.max - 2), i
            assert after.remaining == bucket.max - 2, i


def test_a_command_goes_once_more_not_forever(module_target: Target):
    """Killed again while sent the second time: Redis failing, each its own
    policy or the ConnectionError, and nothing ran."""
    keys = buckets()
    answers = kill_the_connection_in_flight(module_target, keys, 2)
    for i, ((_, bucket), (d, after)) in enumerate(zip(keys, answers, strict=True)):
        if i % 2 and i % 5 != 4:
            assert type(d) is redis.ConnectionError, (i, d)
        else:
            assert isinstance(d, Decision) and not d.allowed and d.degraded, (i, d)
        assert after.remaining == bucket.max - 1, i


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


def test_a_limiter_serves_one_event_loop_after_another(module_target: Target):
    """Each asyncio.run() closes its loop, and with it the connection made
    there: the next loop gets a connection of its own."""
    lim = tb_asyncio.Limiter(module_target.async_client(max_connections=2), timeout=5)
    bucket = Bucket(100, SLOW)

    async def burst() -> list[int]:
        # More calls than the pool has connections: all go on the one pipelined connection.
        out = await asyncio.gather(*(lim.consume("rl:pipe:loops", bucket) for _ in range(10)))
        assert not any(d.degraded or d.shed for d in out)
        return sorted(d.remaining for d in out)

    assert run(burst()) == list(range(90, 100))
    assert run(burst()) == list(range(80, 90))
    run(lim.aclose())


def test_a_connection_not_up_within_the_budget_sheds_each_task_waiting_for_it(own_server: Server):
    """The tasks that find no connection share one connect, which Redis
    (frozen: the kernel accepts, nothing answers redis-py's handshake) does
    not finish within their budget, though the loop is held past it and
    looks again: each is shed (local overload, whatever the policy),
    nothing reached Redis, and the breaker saw no failure."""
    keys = buckets()

    async def hold_the_loop() -> None:
        time.sleep(0.3)

    async def main() -> tuple[list[Any], str, int]:
        # A client name: redis-py's connect then waits for CLIENT SETNAME's
        # reply, whatever its version.
        client = redis.asyncio.Redis(port=own_server.port, client_name="tb-test")
        async with tb_asyncio.Limiter(client, backend="module", timeout=0.05, on_error="open") as lim:
            own_server.pause()
            try:
                out = await asyncio.gather(*(lim.consume(key, bucket) for key, bucket in keys), hold_the_loop())
                state = lim.breaker_state
            finally:
                own_server.resume()
        written = await client.exists(*(key for key, _ in keys))
        await client.aclose()
        return list(out[:-1]), state, written

    shed, state, written = run(main())
    assert all(not d.allowed and d.shed and not d.degraded for d in shed)
    assert state == "closed"
    assert written == 0


@pytest.mark.parametrize("encoding", ["utf-8", "latin-1"])
def test_commands_pack_as_redis_py_packs_them(encoding: str):
    """The limiter's own packing against redis-py's Python packer (the
    asyncio connection's, which is always that one), on the kinds of
    argument it sends and the ones only a client's encoder takes."""
    from redis.asyncio.connection import Connection

    from redis_tokenbucket._pack import pack

    commands: list[tuple[Any, ...]] = [
        ("TB.CONSUME", "rl:user:7", "10.0", "0.17", "1.0"),
        ("FCALL", "tb_mconsume", 2, b"rl:{u}:a", "rl:{u}:é", "1e-05", "2", "3"),
        ("FUNCTION LOAD", "REPLACE", "#!lua name=tb\n" + "x" * 70_000),
        ("EVALSHA", "ab" * 20, 1, "k", "consume", -3, 0, 2**70, 1.5, memoryview(b"mv"), b""),
        ("FCALL_RO", "tb_version", 0),
        ("PING",),
    ]
    conn = Connection(encoding=encoding)
    for args in commands:
        assert pack(args, conn.encoder) == b"".join(conn.pack_command(*args)), args
    for bad in (True, None):
        with pytest.raises(redis.DataError):
            pack(("TB.CONSUME", bad), conn.encoder)
