"""The failure model (docs/failure-model.md): only Redis failing is
subject to on_error; local overload sheds and is never admitted; the
budget runs from the write; a default budget, no helper threads, close()."""

from __future__ import annotations

import asyncio
import errno
import json
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis
import redis.asyncio
from conftest import SLOW, Target, all_connections_busy, run
from redis.backoff import AbstractBackoff
from redis.connection import Connection
from redis.retry import Retry
from tbservers import Server, free_port

import redis_tokenbucket.asyncio as tb_asyncio
from redis_tokenbucket import Breaker, Bucket, DecisionEvent, Limiter, LimiterError, MultiDecision, NoBackendError
from redis_tokenbucket._contract import message
from redis_tokenbucket._transport import Shed, classify
from redis_tokenbucket.fastapi import RateLimit, Rule, user_id

B = Bucket(50, SLOW, name="user")


def blocking(seconds: float) -> Any:
    """A task that holds the event loop, as a CPU-bound request does."""

    async def hold() -> None:
        time.sleep(seconds)

    return hold()


def within(seconds: float, call: Callable[[], Any]) -> Any:
    """call() on a daemon thread; fails the test if it has not returned
    after `seconds` (a liveness guard, generous: not a timing assertion)."""
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(call()), daemon=True)
    thread.start()
    thread.join(seconds)
    assert out, f"no answer after {seconds} s"
    return out[0]


# ---- a full pool is back-pressure, not an outage -----------------------------


def test_asyncio_pool_exhaustion_waits_instead_of_failing_open(module_target: Target):
    async def main() -> list[Any]:
        client = module_target.async_client(max_connections=10)
        lim = tb_asyncio.Limiter(client, on_error="open", timeout=5)
        try:
            return list(await asyncio.gather(*(lim.consume("rl:pool", B) for _ in range(300))))
        finally:
            await lim.aclose()
            await client.aclose()

    decisions = run(main())
    assert sum(d.allowed for d in decisions) == 50
    assert not any(d.degraded or d.shed for d in decisions)


def test_sync_pool_exhaustion_waits_instead_of_failing_open(module_target: Target):
    client = module_target.client(max_connections=4)
    lim = Limiter(client, on_error="open", timeout=5)
    out: list[Any] = []
    threads = [
        threading.Thread(target=lambda: out.extend(lim.consume("rl:pool", B) for _ in range(10))) for _ in range(30)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(out) == 300 and sum(d.allowed for d in out) == 50
    assert not any(d.degraded or d.shed for d in out)
    lim.close()


def test_a_loop_held_past_the_budget_sheds_nothing_it_sent(module_target: Target):
    """A pool of one connection, a budget of 50 ms: 20 calls are sent, then
    the event loop is held for 300 ms (a CPU-bound request), then 5 more
    calls come. Redis answered the 20 in time, and the 5 are sent at once
    (the asyncio limiter pipelines every command on its one connection,
    the pool's size bounds nothing there): each of the 25 gets Redis's own
    answer, under every policy; none is shed, none degraded."""

    async def main(policy: Any) -> tuple[list[Any], str]:
        client = module_target.async_client(max_connections=1)
        lim = tb_asyncio.Limiter(client, timeout=0.05, on_error=policy)
        key = f"rl:busy:{policy}"
        try:
            await lim.peek(key, B)  # connected

            async def late() -> list[Any]:
                await asyncio.sleep(0)  # the others are sent
                time.sleep(0.3)
                return list(await asyncio.gather(*(lim.consume(key, B) for _ in range(5))))

            *first, then = await asyncio.gather(*(lim.consume(key, B) for _ in range(20)), late())
            return [*first, *then], lim.breaker_state
        finally:
            await lim.aclose()
            await client.aclose()

    for policy in ("open", "closed", "raise", "local"):
        out, state = run(main(policy))
        assert sorted(d.remaining for d in out) == list(range(25, 50)), policy  # Redis's answers, each its own
        assert all(d.allowed and not d.degraded and not d.shed for d in out), policy
        assert state == "closed"


def test_a_sync_call_that_gets_no_connection_in_time_is_shed(module_target: Target):
    """Every connection of the sync limiter busy (other threads' calls): a
    thread that waits past its budget for one is shed under every policy,
    charged nothing, and not counted by the breaker (which one Redis
    failure would open here)."""
    lim = Limiter(module_target.client(max_connections=2), breaker=Breaker(1, 10, 2))
    assert lim.consume("rl:busy", B).remaining == 49  # connected, the backend found
    with all_connections_busy(lim):
        for policy in ("raise", "open", "closed", "local"):
            d = lim.consume("rl:busy", B, timeout=0.05, on_error=policy)
            assert (d.allowed, d.shed, d.degraded, d.retry_after_ms) == (False, True, False, 1000), policy
            m = lim.consume_many([("rl:busy", B), ("rl:busy2", B)], timeout=0.05, on_error=policy)
            assert (m.allowed, m.shed, m.degraded) == (False, True, False), policy
        assert lim.breaker_state == "closed"
    d = lim.consume("rl:busy", B)
    assert (d.allowed, d.degraded, d.remaining) == (True, False, 48)  # the shed calls charged nothing
    lim.close()


@pytest.mark.parametrize("flavour", ["sync", "asyncio"])
def test_a_connection_not_up_in_time_is_redis_failing_sync_and_shed_asyncio(flavour: str):
    """A listener whose accept queue is full answers no new connect, as a
    host that drops packets. The sync limiter's thread waits in the
    connect itself, so its timing out is Redis failing (degraded, counted
    by the breaker); the asyncio limiter can't tell a connect not up in
    time from a busy loop that has not looked yet, so it sheds
    (docs/failure-model.md)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port = listener.getsockname()[1]
        queued: list[socket.socket] = []  # connected, never accepted
        try:
            while len(queued) < 16:
                sock = socket.socket()
                sock.settimeout(0.2)
                try:
                    sock.connect(("127.0.0.1", port))
                except TimeoutError:
                    sock.close()
                    break
                queued.append(sock)
            else:
                pytest.fail("the listener's accept queue never filled")
            options: dict[str, Any] = {"timeout": 0.1, "on_error": "closed", "breaker": Breaker(1, 10, 2)}
            if flavour == "sync":
                lim = Limiter(redis.Redis(port=port), backend="module", **options)
                d, state = lim.consume("k", B), lim.breaker_state
                lim.close()
            else:

                async def main() -> tuple[Any, str]:
                    alim = tb_asyncio.Limiter(redis.asyncio.Redis(port=port), backend="module", **options)
                    try:
                        return await alim.consume("k", B), alim.breaker_state
                    finally:
                        await alim.aclose()

                d, state = run(main())
        finally:
            for sock in queued:
                sock.close()
    if flavour == "sync":
        assert (d.allowed, d.degraded, d.shed, state) == (False, True, False, "open")
    else:
        assert (d.allowed, d.degraded, d.shed, state) == (False, False, True, "closed")


def test_a_reply_that_came_while_the_loop_was_busy_is_read_not_failed(module_target: Target):
    """The budget runs from the write; a reply sitting in the socket when
    the timer finally runs is Redis's answer, not a timeout."""

    async def main() -> list[Any]:
        client = module_target.async_client()
        lim = tb_asyncio.Limiter(client, timeout=0.05, on_error="open")
        try:
            await lim.peek("rl:late", B)
            one = await asyncio.gather(lim.consume("rl:late", B), blocking(0.3))
            many = await asyncio.gather(lim.consume_many([("rl:late2", B)]), blocking(0.3))
            return [one[0], many[0]]
        finally:
            await lim.aclose()
            await client.aclose()

    one, many = run(main())
    assert (one.allowed, one.degraded, one.remaining) == (True, False, 49)
    assert isinstance(many, MultiDecision) and (many.allowed, many.degraded) == (True, False)


# ---- the default budget; redis-py's retries don't multiply it ----------------


def test_readme_setup_fails_open_in_time_on_a_frozen_redis(own_server: Server):
    """No timeout given: the limiter's own default budget applies."""
    own_server.pause()

    async def main() -> Any:
        client = redis.asyncio.Redis(port=own_server.port)
        lim = tb_asyncio.Limiter(client, on_error="open")
        try:
            return await asyncio.wait_for(lim.consume("k", B), 5)  # a liveness guard
        finally:
            await lim.aclose()

    d = run(main())
    assert d.allowed and d.degraded
    sync = Limiter(redis.Redis(port=own_server.port), on_error="closed")
    d = within(5, lambda: sync.consume("k", B))
    assert not d.allowed and d.degraded
    sync.close()


class CountingBackoff(AbstractBackoff):
    """Counts on the class: redis-py deep-copies a client's Retry."""

    calls = 0

    def compute(self, failures: int) -> float:
        CountingBackoff.calls += 1
        return 0.01


# What redis-py 6+ retries by default (redis-py 5 needs to be told).
RETRY_ON: list[type[Exception]] = [redis.ConnectionError, redis.TimeoutError]


@pytest.mark.parametrize("redis_is", ["frozen", "stopped"])
@pytest.mark.parametrize("flavour", ["sync", "asyncio"])
def test_the_clients_retries_do_not_multiply_the_budget(flavour: str, redis_is: str, own_server: Server):
    """A client that retries on timeouts and connection errors (redis-py
    6+ does by default, 3 times with backoff) would pay the budget once
    per try on a frozen Redis, and its backoff on every refused connect
    of a stopped one; each of the limiter's commands is tried once (the
    first on the connection it had, the second on a new one), and the
    breaker decides when to try again. (redis-py 5's sync pool connects
    outside its retries, so only a newer redis-py can fail sync-stopped.)"""
    settings: dict[str, Any] = {"port": own_server.port, "socket_timeout": 0.05, "retry_on_error": RETRY_ON}
    down = own_server.pause if redis_is == "frozen" else own_server.stop
    if flavour == "sync":
        lim = Limiter(
            redis.Redis(retry=Retry(CountingBackoff(), 3), **settings), timeout=0.3, on_error="open", breaker=False
        )
        assert not lim.consume("k", B).degraded  # connected
        down()
        CountingBackoff.calls = 0
        decisions = [lim.consume("k", B) for _ in range(2)]
    else:
        from redis.asyncio.retry import Retry as AsyncRetry

        async def main() -> list[Any]:
            client = redis.asyncio.Redis(retry=AsyncRetry(CountingBackoff(), 3), **settings)
            alim = tb_asyncio.Limiter(client, timeout=0.3, on_error="open", breaker=False)
            assert not (await alim.consume("k", B)).degraded
            down()
            CountingBackoff.calls = 0
            return [await alim.consume("k", B) for _ in range(2)]

        decisions = run(main())
    assert all(d.allowed and d.degraded for d in decisions)
    assert CountingBackoff.calls == 0


# ---- what an error means: Redis failing, local overload, or usage --------------


def reply_error(reply: str) -> Exception:
    """What redis-py makes of an error reply (the limiter's own connections
    parse theirs with the same function)."""
    error: Exception = Connection()._parser.parse_error(reply)
    return error


def cluster_reply_error(reply: str) -> Exception:
    """What a Cluster client makes of it: classes of their own for
    CLUSTERDOWN, MASTERDOWN and TRYAGAIN, without the code (redis-py 5's
    ClusterParser; redis-py 8 has no such parser, every one does this)."""
    import redis.cluster

    parser = getattr(redis.cluster, "ClusterParser", None) or Connection()._parser
    error: Exception = parser.parse_error(reply)
    return error


# docs/failure-model.md: "the server says it can't serve".
UNAVAILABLE = [
    "LOADING Redis is loading the dataset in memory",
    "READONLY You can't write against a read only replica.",
    "MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.",
    "CLUSTERDOWN The cluster is down",
    "BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSCRIPT.",
    "OOM command not allowed when used memory > 'maxmemory'.",
    "TRYAGAIN Multiple keys request during rehashing of slot",
    "MISCONF Redis is configured to save RDB snapshots, but it's currently unable to persist to disk. "
    "Commands that may modify the data set are disabled, because this instance is configured to report "
    "errors during writes if RDB snapshotting fails (stop-writes-on-bgsave-error option). "
    "Please check the Redis logs for details about the RDB error.",
    "NOREPLICAS Not enough good replicas to write.",
]


@pytest.mark.parametrize("parse", [reply_error, cluster_reply_error], ids=["standalone", "cluster"])
@pytest.mark.parametrize("reply", UNAVAILABLE, ids=lambda reply: reply.split()[0])
def test_a_server_that_cannot_serve_now_is_redis_failing(reply: str, parse: Callable[[str], Exception]):
    error = parse(reply)
    assert classify(error) == "failure", repr(error)


# Real servers that refuse writes for now, and how each is undone.
REFUSALS: list[tuple[str, tuple[str, ...] | None, tuple[str, ...]]] = [
    ("NOREPLICAS", ("CONFIG", "SET", "min-replicas-to-write", "1"), ("CONFIG", "SET", "min-replicas-to-write", "0")),
    ("OOM", ("CONFIG", "SET", "maxmemory", "1"), ("CONFIG", "SET", "maxmemory", "0")),
    ("READONLY", None, ("REPLICAOF", "NO", "ONE")),  # None: a replica of a primary that isn't there
]


@pytest.mark.parametrize("flavour", ["sync", "asyncio"])
def test_a_server_that_refuses_writes_for_now_is_redis_failing(flavour: str, own_server: Server):
    """The replies above from a real server, through the whole call: the
    policy answers them (degraded), "raise" raises them, and once the server
    writes again the limiter is back without a restart."""
    admin = own_server.client()

    async def decide(on_error: str) -> Any:
        if flavour == "sync":
            lim: Any = Limiter(redis.Redis(port=own_server.port), on_error=on_error, breaker=False)
            try:
                return lim.consume("k", B)
            finally:
                lim.close()
        alim = tb_asyncio.Limiter(redis.asyncio.Redis(port=own_server.port), on_error=on_error, breaker=False)
        try:
            return await alim.consume("k", B)
        finally:
            await alim.aclose()

    for code, refuse, restore in REFUSALS:
        admin.execute_command(*(refuse or ("REPLICAOF", "127.0.0.1", str(free_port()))))
        with pytest.raises(redis.RedisError) as raised:  # redis-py may drop the code (OutOfMemoryError)
            run(decide("raise"))
        assert classify(raised.value) == "failure", (code, raised.value)
        opened, closed = run(decide("open")), run(decide("closed"))
        assert (code, opened.allowed, opened.degraded, opened.shed) == (code, True, True, False)
        assert (code, closed.allowed, closed.degraded, closed.shed) == (code, False, True, False)
        admin.execute_command(*restore)
        assert (code, run(decide("closed")).degraded) == (code, False)
    admin.close()


def chained(error: BaseException, cause: BaseException) -> BaseException:
    error.__context__ = cause
    return error


@pytest.mark.parametrize(
    "error, kind",
    [
        # Redis failing: the policy answers (docs/failure-model.md).
        pytest.param(
            redis.ConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused."),
            "failure",
            id="refused",
        ),
        pytest.param(redis.ConnectionError("Connection closed by server."), "failure", id="closed"),
        pytest.param(ConnectionResetError(104, "Connection reset by peer"), "failure", id="reset"),
        pytest.param(redis.TimeoutError("no reply from Redis within 0.1 s of the command"), "failure", id="no-reply"),
        pytest.param(TimeoutError(), "failure", id="builtin-timeout"),
        # The server turns the connection away.
        pytest.param(reply_error("ERR max number of clients reached"), "failure", id="maxclients"),
        pytest.param(
            redis.exceptions.RedisClusterException("Redis Cluster cannot be connected."),
            "failure",
            id="no-cluster-node",
        ),
        # Local overload: shed, never degraded. redis-py's pools running
        # out: MaxConnectionsError (a pool of redis-py 6+; the asyncio
        # Cluster's node pools, without a message), a plain ConnectionError
        # from the sync pools before 6, a BlockingConnectionPool's wait
        # running out.
        pytest.param(Shed("no connection to Redis free within 0.1 s"), "shed", id="shed"),
        pytest.param(redis.exceptions.MaxConnectionsError("Too many connections"), "shed", id="max-connections"),
        pytest.param(redis.exceptions.MaxConnectionsError(), "shed", id="max-connections-bare"),
        pytest.param(redis.ConnectionError("Too many connections"), "shed", id="too-many-connections"),
        pytest.param(redis.ConnectionError("No connection available."), "shed", id="blocking-pool"),
        # This process or host out of descriptors, ports, buffers or memory,
        # raw or as redis-py wraps it: local, never Redis failing.
        pytest.param(OSError(errno.EMFILE, "Too many open files"), "shed", id="EMFILE"),
        pytest.param(OSError(errno.ENFILE, "Too many open files in system"), "shed", id="ENFILE"),
        pytest.param(OSError(errno.EADDRNOTAVAIL, "Cannot assign requested address"), "shed", id="EADDRNOTAVAIL"),
        pytest.param(OSError(errno.ENOBUFS, "No buffer space available"), "shed", id="ENOBUFS"),
        pytest.param(OSError(errno.ENOMEM, "Cannot allocate memory"), "shed", id="ENOMEM"),
        pytest.param(
            redis.ConnectionError("Error 24 connecting to 127.0.0.1:6379. Too many open files."),
            "shed",
            id="EMFILE-wrapped",
        ),
        pytest.param(
            redis.ConnectionError("Error 99 connecting to 127.0.0.1:6379. Cannot assign requested address."),
            "shed",
            id="EADDRNOTAVAIL-wrapped",
        ),
        pytest.param(
            redis.ConnectionError("Error 105 while writing to socket. No buffer space available."),
            "shed",
            id="ENOBUFS-wrapped",
        ),
        pytest.param(
            chained(redis.ConnectionError("Error connecting"), OSError(errno.ENFILE, "")), "shed", id="chained"
        ),
        pytest.param(
            redis.ConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused."),
            "failure",
            id="refused-not-local",
        ),
        # Usage errors: raised under every policy.
        pytest.param(reply_error(message("wrongtype")), "usage", id="WRONGTYPE"),
        pytest.param(reply_error(message("bad_fields")), "usage", id="not-a-bucket"),
        pytest.param(reply_error(message("duplicate_key", group=2, first=1)), "usage", id="duplicate-key"),
        pytest.param(
            reply_error("NOPERM User nobody has no permissions to run the 'tb.consume' command"), "usage", id="NOPERM"
        ),
        pytest.param(
            reply_error("WRONGPASS invalid username-password pair or user is disabled."), "usage", id="WRONGPASS"
        ),
        pytest.param(reply_error("BUSYKEY Target key name already exists."), "usage", id="BUSYKEY-not-BUSY"),
        pytest.param(
            NoBackendError([("module", reply_error("ERR unknown command 'TB.PEEK'"))]), "usage", id="no-backend"
        ),
        pytest.param(redis.DataError("Invalid input of type: 'NoneType'."), "usage", id="data"),
        pytest.param(TypeError("key must be a str, bytes or int, got NoneType"), "usage", id="key-type"),
    ],
)
def test_classify_tells_redis_failing_from_overload_and_usage(error: BaseException, kind: str):
    assert classify(error) == kind


EXHAUST = textwrap.dedent("""
    import asyncio, json, os, resource, sys
    import redis, redis.asyncio
    from redis_tokenbucket import Breaker, Bucket, Limiter
    import redis_tokenbucket.asyncio as tb_asyncio

    port, flavour = int(sys.argv[1]), sys.argv[2]
    B = Bucket(1, 0.001)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)

    def kill_the_limiters_connections():
        with redis.Redis(port=port) as admin:
            admin.client_kill_filter(_type="normal", skip_me=True)

    def exhaust():
        # The lowest free descriptor number as the limit: no new one opens.
        lowest = os.open(os.devnull, os.O_RDONLY)
        os.close(lowest)
        resource.setrlimit(resource.RLIMIT_NOFILE, (lowest, hard))

    def row(d):
        return [d.allowed, d.degraded, d.shed, d.retry_after_ms, d.remaining]

    # A descriptor below the limiter's socket, freed before the limit is
    # lowered to it: closing that socket then frees none under the limit.
    hole = os.open(os.devnull, os.O_RDONLY)
    out = []
    if flavour == "sync":
        lim = Limiter(redis.Redis(port=port), on_error="open", breaker=Breaker(1, 10, 2))
        out += [row(lim.consume("rl:fd", B)), row(lim.consume("rl:fd", B))]
        os.close(hole)
        kill_the_limiters_connections()
        exhaust()
        out += [row(lim.consume("rl:fd", B)), lim.breaker_state]
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        out += [row(lim.consume("rl:fd", B))]
    else:
        async def main():
            lim = tb_asyncio.Limiter(redis.asyncio.Redis(port=port), on_error="open", breaker=Breaker(1, 10, 2))
            rows = [row(await lim.consume("rl:fd", B)), row(await lim.consume("rl:fd", B))]
            os.close(hole)
            kill_the_limiters_connections()
            await asyncio.sleep(0.1)  # the loop hears of it: the next call connects
            exhaust()
            rows += [row(await lim.consume("rl:fd", B)), lim.breaker_state]
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
            rows += [row(await lim.consume("rl:fd", B))]
            await lim.aclose()
            return rows
        out = asyncio.run(main())
    print(json.dumps(out))
""")


@pytest.mark.parametrize("flavour", ["sync", "asyncio"])
def test_running_out_of_descriptors_is_shed_never_admitted(own_server: Server, flavour: str):
    """A bucket Redis has just denied; the limiter's connections dropped;
    then the process's descriptors run out (RLIMIT_NOFILE lowered for real,
    in a child process). Under on_error="open" the call is shed: not
    admitted, not degraded, and not counted by the breaker (one Redis
    failure would open it). With descriptors back, Redis answers again."""
    proc = subprocess.run(
        [sys.executable, "-c", EXHAUST, str(own_server.port), flavour], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    first, denied, exhausted, state, after = json.loads(proc.stdout)
    assert first == [True, False, False, 0, 0]
    assert denied[:3] == [False, False, False]
    assert exhausted == [False, False, True, 1000, 0]
    assert state == "closed"
    assert after[:3] == [False, False, False]  # Redis's own denial


# ---- usage errors always raise --------------------------------------------------


def test_a_key_that_is_not_a_bucket_raises_under_every_policy(target: Target):
    with target.admin() as admin:
        admin.set("rl:string", "x")
        admin.hset("rl:hash", mapping={"a": "1"})
    lim = Limiter(target.client())
    for policy in ("open", "closed", "local"):
        for key in ("rl:string", "rl:hash"):
            with pytest.raises(redis.ResponseError):
                lim.consume(key, B, on_error=policy)
            with pytest.raises(redis.ResponseError):
                lim.consume_many([(key, B, 1), ("rl:other", B, 1)], on_error=policy)
    assert lim.breaker_state == "closed"


def test_a_wrong_password_raises_under_every_policy(module_target: Target):
    lim = Limiter(module_target.client(username="nobody", password="wrong"), on_error="open")
    with pytest.raises(redis.AuthenticationError):
        lim.consume("k", B)


# ---- decision events ----------------------------------------------------------------


def test_on_decision_sees_each_decision_once(module_target: Target, own_server: Server):
    events: list[DecisionEvent] = []
    lim = Limiter(module_target.client(), on_decision=events.append, denial_cache=100)
    lim.consume("rl:ev", Bucket(1, SLOW, name="user"))
    lim.consume("rl:ev", Bucket(1, SLOW, name="user"))  # denied by Redis
    lim.consume("rl:ev", Bucket(1, SLOW, name="user"))  # denied from the cache
    lim.consume_many([("rl:ev2", Bucket(5, SLOW, name="key")), ("rl:ev3", Bucket(5, SLOW))])
    assert [(e.op, e.policy, e.allowed, e.degraded, e.shed, e.cached, e.backend, e.breaker) for e in events] == [
        ("consume", "user", True, False, False, False, "module", "closed"),
        ("consume", "user", False, False, False, False, "module", "closed"),
        ("consume", "user", False, False, False, True, "module", "closed"),
        ("consume_many", "key", True, False, False, False, "module", "closed"),
    ]
    assert all(e.latency_s >= 0 for e in events)

    own_server.stop()
    dead: list[DecisionEvent] = []
    lim = Limiter(own_server.client(), on_error="closed", on_decision=dead.append)
    lim.consume("k", B)
    with pytest.raises(redis.ConnectionError):
        lim.consume("k", B, on_error="raise")  # raised: not a decision
    assert [(e.allowed, e.degraded, e.backend) for e in dead] == [(False, True, "")]


def test_a_failing_hook_never_breaks_the_call(module_target: Target, caplog: pytest.LogCaptureFixture):
    def hook(event: DecisionEvent) -> None:
        raise RuntimeError("metrics down")

    d = Limiter(module_target.client(), on_decision=hook).consume("k", B)
    assert d.allowed and "on_decision hook raised" in caplog.text


# ---- shed answers over HTTP ------------------------------------------------------------


def test_fastapi_answers_a_shed_decision_with_503_and_retry_after():
    limit = RateLimit(tb_asyncio.Limiter(redis.asyncio.Redis()), Rule(B, user_id()))
    shed = MultiDecision(False, 1000, (), shed=True)
    res = limit.answer(shed)
    assert res is not None and res.status_code == 503 and res.headers["Retry-After"] == "1"


# ---- close(), and a frozen Redis can't hold the interpreter ------------------------


def test_close_and_context_managers(module_target: Target):
    with Limiter(module_target.client()) as lim:
        assert lim.consume("k", B).allowed
    with pytest.raises(LimiterError, match="closed"):
        lim.consume("k", B)

    async def main() -> None:
        async with tb_asyncio.Limiter(module_target.async_client()) as alim:
            assert (await alim.consume("k", B)).allowed
        with pytest.raises(LimiterError, match="closed"):
            await alim.consume("k", B)

    run(main())


def test_a_frozen_redis_does_not_keep_the_interpreter_alive(own_server: Server):
    own_server.pause()
    script = textwrap.dedent(f"""
        import redis
        from redis_tokenbucket import Bucket, Limiter
        lim = Limiter(redis.Redis(port={own_server.port}), timeout=0.2, on_error="open")
        print(lim.consume("k", Bucket(5, 1)).degraded)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "True", proc.stderr
