"""Everything the sync and asyncio limiters share.

Each operation is written once, as a plan: a generator that yields the
Redis commands to send and receives their replies (or has their errors
thrown in). The sync Limiter runs a plan with blocking calls, the asyncio
one with awaits; neither knows what the commands are. Argument checks,
backend detection, Cluster routing and the Cluster fallback, the denial
cache and the failure policy (with the breaker and the local fallback) all
live here; how commands reach Redis is in _transport.
"""

from __future__ import annotations

import inspect
import logging
import threading
import time
from collections.abc import Callable, Generator, Iterable, Sequence
from dataclasses import replace
from typing import Any, Generic, Literal, NoReturn, Optional, TypeVar, Union, cast

from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster
from redis.exceptions import NoScriptError, ResponseError

from . import _local
from ._breaker import Breaker
from ._bucket import Bucket, InvalidArgument, KeyT, check_cost, check_delta, invalid
from ._cache import DenialCache
from ._cache import denial_cache as make_denial_cache
from ._classify import classify
from ._clients import check_client
from ._commands import Command, Once, ToNode
from ._contract import MAX_GROUPS
from ._decision import Decision, MultiDecision
from ._errors import CircuitOpenError, CrossSlotError, LimiterError, NoBackendError, Shed
from ._events import DecisionEvent
from ._keys import check_key, client_encoding, key_bytes
from ._lease import Concurrency, Held, Lease, check_id, new_id
from ._scripts import (
    VERSION_ARGS,
    Args,
    BucketOp,
    Group,
    LeaseHead,
    Op,
    eval_args,
    eval_script,
    fcall_args,
    library_source,
    library_version,
    module_args,
)

log = logging.getLogger("redis_tokenbucket")

T = TypeVar("T")
C = TypeVar("C")


Plan = Generator[Command, Any, T]
"""Yields commands, receives replies, returns the result."""

BackendName = Literal["module", "functions", "eval"]
BACKENDS: tuple[BackendName, ...] = ("module", "functions", "eval")
OnError = Literal["raise", "open", "closed", "local"]
ON_ERROR: tuple[OnError, ...] = ("raise", "open", "closed", "local")

# The limiter's budget for Redis to answer a command, from when it is
# written (seconds): a request path's, not a batch job's. None turns it off.
DEFAULT_TIMEOUT = 0.1
# While the backend is unknown (the first calls, or after a reply said it
# is gone), a call may load the Lua library, which Redis compiles: many
# gateways' first requests at once can keep it busy past a request-path
# budget. Such calls get at least this budget (seconds).
DETECT_TIMEOUT = 1.0
# What a shed decision tells the client to wait (HTTP Retry-After: 1).
SHED_RETRY_MS = 1000

OnDecision = Callable[[DecisionEvent], None]

GroupIn = Union[tuple[KeyT, Bucket], tuple[KeyT, Bucket, float]]

# The probe `detect()` peeks at; under `rl:` like the usual buckets, so an
# ACL key pattern such as `~rl:*` covers it.
PROBE_KEY = "rl:probe"
_PROBE = Bucket(1, 1)


def refused(exc: BaseException) -> bool:
    """The server (or a cluster client, from the server's command table)
    says this command doesn't exist here, or that this user may not run it."""
    text = str(exc).lower()
    return "unknown command" in text or "doesn't exist in redis commands" in text or "no permissions to run" in text


def function_missing(exc: BaseException) -> bool:
    """The Functions library is not loaded (never, or flushed since)."""
    return isinstance(exc, ResponseError) and "function not found" in str(exc).lower()


class _Unavailable(Exception):
    """A backend can't serve this server: try the next one."""

    def __init__(self, backend: BackendName, cause: BaseException) -> None:
        super().__init__(backend, cause)
        self.backend = backend
        self.cause = cause


class Engine:
    """Sends one operation on the backend in use, and finds that backend:
    on first use, and again when a reply says it is gone (a failover to a
    node without the module, FUNCTION FLUSH, a restart)."""

    def __init__(self, forced: Optional[BackendName], cluster: Any = None) -> None:
        if forced is not None and forced not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(BACKENDS)} (or None to detect it)")
        self.forced = forced
        self.backend: Optional[BackendName] = forced
        # A cluster client (sync or asyncio), to send each FCALL to its key's node.
        self._cluster = cluster
        self._retryable: tuple[type[Exception], ...] = cluster.ERRORS_ALLOW_RETRY if cluster is not None else ()
        # Whether the Functions library on the server (every primary of a
        # Cluster) is known to be this package's copy, and whether a call
        # is finding out (checking, or loading it) right now.
        self._library_checked = False
        self._library_checking = False

    def call(self, op: Op, groups: Sequence[Group], lease: Optional[LeaseHead] = None) -> Plan[Any]:
        """Sends `op` on its groups (a lease operation: on its key and head,
        with the groups as its buckets) and returns the reply."""
        backend = self.backend
        if backend is not None:
            try:
                return (yield from self._send(backend, op, groups, lease))
            except _Unavailable as gone:
                if self.forced:
                    raise NoBackendError([(backend, gone.cause)]) from gone.cause
                log.warning("rate limiter: the %s backend is gone (%s), detecting again", backend, gone.cause)
                self.backend = None
                # The node found next (after a failover) may hold another
                # library, or none: check it again there.
                self._library_checked = False
        return (yield from self._detect(op, groups, lease))

    def _detect(self, op: Op, groups: Sequence[Group], lease: Optional[LeaseHead]) -> Plan[Any]:
        # The call itself is the probe: a refusal means nothing ran.
        failures: list[tuple[str, BaseException]] = []
        for name in BACKENDS:
            try:
                reply = yield from self._send(name, op, groups, lease)
            except _Unavailable as exc:
                failures.append((name, exc.cause))
                continue
            self.backend = name
            log.info("rate limiter: using the %s backend", name)
            return reply
        raise NoBackendError(failures)

    def _send(self, backend: BackendName, op: Op, groups: Sequence[Group], lease: Optional[LeaseHead]) -> Plan[Any]:
        if op == "adjust" and groups[0][2] > 0:
            # A refund: run twice, it would mint. The transport sends it
            # again only where it provably never reached Redis.
            return (yield from _once(self._send_as(backend, op, groups, lease)))
        return (yield from self._send_as(backend, op, groups, lease))

    def _send_as(self, backend: BackendName, op: Op, groups: Sequence[Group], lease: Optional[LeaseHead]) -> Plan[Any]:
        if backend == "module":
            try:
                return (yield module_args(op, groups, lease))
            except Exception as exc:
                if refused(exc):
                    raise _Unavailable(backend, exc) from exc
                raise
        if backend == "functions":
            return (yield from self._fcall(op, groups, lease))
        return (yield from self._eval(eval_args(op, groups, lease)))

    def _fcall(self, op: Op, groups: Sequence[Group], lease: Optional[LeaseHead]) -> Plan[Any]:
        if self._library_checking:
            # Another call is checking or loading the library right now: a
            # burst of first calls (or of calls after FUNCTION FLUSH) must
            # not each load it, since every FUNCTION LOAD compiles it while
            # Redis waits. The EVAL script needs no loading and answers the
            # same.
            return (yield from self._eval(eval_args(op, groups, lease)))
        args = fcall_args(op, groups, lease)
        key = lease[0] if lease is not None else groups[0][0]
        if not self._library_checked:
            self._library_checking = True
            try:
                yield from self._check_library()
            finally:
                self._library_checking = False
        try:
            return (yield from self._to_key_node(args, key))
        except Exception as exc:
            if refused(exc):
                raise _Unavailable("functions", exc) from exc
            if not function_missing(exc):
                raise
        self._library_checking = True
        try:
            yield from self._load_library()
        finally:
            self._library_checking = False
        return (yield from self._to_key_node(args, key))

    def _check_library(self) -> Plan[None]:
        """Before the first FCALL: the library loaded (on every primary of a
        Cluster) must be this package's copy, as `tb_version` tells. None,
        an older one, or a foreign one (no `tb_version`) is replaced by it."""
        command: Command = ToNode(VERSION_ARGS, self._primaries()) if self._cluster is not None else VERSION_ARGS
        try:
            reply = yield command
        except Exception as exc:
            if refused(exc):
                raise _Unavailable("functions", exc) from exc
            if not function_missing(exc):
                raise
            reply = None
        # A cluster client answers for several nodes with {node: reply}.
        replies = reply.values() if isinstance(reply, dict) else [reply]
        ours = library_version()
        if any((r.decode() if isinstance(r, bytes) else r) != ours for r in replies):
            yield from self._load_library()
        self._library_checked = True

    def _primaries(self) -> Any:
        """Every primary, as nodes: redis-py 8 asks a server for the keys of
        an FCALL sent to the "primaries" flag (COMMAND GETKEYS), not of one
        sent to nodes. An asyncio cluster client knows no node before its
        first command: the flag then."""
        nodes = self._cluster.get_primaries()
        return nodes or "primaries"

    def _load_library(self) -> Plan[None]:
        try:
            # REPLACE: idempotent when gateways race, or some Cluster
            # primaries have it already. A cluster client sends it to all.
            yield ("FUNCTION LOAD", "REPLACE", library_source())
        except ResponseError as exc:
            # Refused (Redis 6.2, an ACL without FUNCTION, a managed service
            # that disables it): the EVAL script needs no loading.
            raise _Unavailable("functions", exc) from exc
        self._library_checked = True

    def _to_key_node(self, args: Args, key: KeyT) -> Plan[Any]:
        """Sends an FCALL, on a cluster client straight to the node of its
        first key. Left to itself, redis-py asks a server which arguments
        of an FCALL are keys (COMMAND GETKEYS) before each one: a second
        round trip per call. (TB.* and EVALSHA it parses itself.)"""
        node = self._node_of(key)
        if node is None:
            return (yield args)
        try:
            return (yield ToNode(args, node))
        except self._retryable:
            # redis-py retries these on a fresh slot map, but not for a
            # node given to it: let it.
            return (yield args)

    def _node_of(self, key: KeyT) -> Any:
        if self._cluster is None:
            return None
        try:
            return self._cluster.get_node_from_key(key)
        except Exception:  # no slot map yet: let redis-py find it
            return None

    def _eval(self, tail: Args) -> Plan[Any]:
        script = eval_script()
        try:
            return (yield ("EVALSHA", script.sha, *tail))
        except NoScriptError:
            pass  # not cached on this node (restart, failover, SCRIPT FLUSH)
        except Exception as exc:
            if refused(exc):
                raise _Unavailable("eval", exc) from exc
            raise
        try:
            # EVAL runs the script and caches it for the next EVALSHA.
            return (yield ("EVAL", script.source, *tail))
        except Exception as exc:
            if refused(exc):
                raise _Unavailable("eval", exc) from exc
            raise


def _once(plan: Plan[T]) -> Plan[T]:
    """The plan, each command it yields marked `Once`."""
    try:
        command = next(plan)
        while True:
            try:
                reply = yield command if isinstance(command, Once) else Once(command)
            except Exception as exc:
                command = plan.throw(exc)
            else:
                command = plan.send(reply)
    except StopIteration as done:
        result: T = done.value
        return result


# Plain classes with __slots__, not dataclasses: they are built on every
# call, and the hot path is worth a few microseconds.


class OneRequest:
    __slots__ = ("amount", "bucket", "key", "op")

    def __init__(self, op: BucketOp, key: KeyT, bucket: Bucket, amount: float) -> None:
        self.op, self.key, self.bucket, self.amount = op, key, bucket, amount


class ManyRequest:
    __slots__ = ("each", "groups")

    def __init__(self, groups: tuple[Group, ...], each: bool) -> None:
        self.groups = groups
        self.each = each  # bucket by bucket instead of one MCONSUME


class LeaseRequest:
    """A lease operation: its key, the Concurrency it is under (None for
    inflight), the lease id and weight, the buckets of an acquire, and the
    arguments sent before them (`head`, see _scripts.LeaseHead)."""

    __slots__ = ("concurrency", "groups", "head", "id", "key", "op", "weight")

    def __init__(
        self,
        op: Op,
        key: KeyT,
        concurrency: Optional[Concurrency],
        lease_id: KeyT,
        weight: int,
        groups: Sequence[Group],
        head: Args,
    ) -> None:
        self.op, self.key, self.concurrency, self.id, self.weight = op, key, concurrency, lease_id, weight
        self.groups = tuple(groups)
        self.head = head


class Job(Generic[T]):
    """One call, ready to run: its plan, or `done`, its answer when it needs
    no round trip (a cached denial); its timeout and failure policy; how to
    answer without Redis (`answers`); and the request (for a log line and
    the decision event). `source` names who answered when it was not the
    backend: "local" (the in-process buckets) or "" (the policy, a shed)."""

    __slots__ = ("answers", "done", "on_error", "plan", "req", "source", "timeout")

    def __init__(
        self,
        plan: Optional[Plan[T]],
        done: Optional[T],
        answers: Answers[T],
        req: Union[OneRequest, ManyRequest, LeaseRequest, str],
        options: tuple[Optional[float], OnError],
    ) -> None:
        self.plan, self.done, self.answers, self.req = plan, done, answers, req
        self.timeout, self.on_error = options
        self.source: Optional[str] = None

    @property
    def what(self) -> str:
        return describe(self.req)


class Answers(Generic[T]):
    """How a kind of call answers without Redis: by policy (admit or deny,
    `degraded`), from the in-process buckets (`local`), or shed."""

    __slots__ = ("local", "policy", "shed")

    def __init__(
        self,
        policy: Callable[[Any, bool], T],
        local: Callable[[_local.LocalBuckets, Any], T],
        shed: Callable[[Any], T],
    ) -> None:
        self.policy, self.local, self.shed = policy, local, shed


_OUTCOME = {"open": "admitted", "closed": "denied", "local": "local buckets", "raise": "raised"}


class _ErrorLog:
    """Logs degraded answers: the first at once, then at most one line per
    `every` seconds and policy counting the others, so an outage can't
    flood the log."""

    every = 1.0

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last: dict[OnError, float] = {}
        self._unreported: dict[OnError, int] = {}

    def report(self, exc: BaseException, on_error: OnError, what: str) -> None:
        with self._lock:
            now = time.monotonic()
            if now - self._last.get(on_error, -float("inf")) < self.every:
                self._unreported[on_error] = self._unreported.get(on_error, 0) + 1
                return
            more = self._unreported.pop(on_error, 0)
            self._last[on_error] = now
        log.error(
            "rate limiter unavailable (fail-%s: %s) for %s: %s: %s%s",
            on_error,
            _OUTCOME[on_error],
            what,
            type(exc).__name__,
            exc,
            f" ({more} more degraded answers since the last report)" if more else "",
        )


class LimiterBase(Generic[C]):
    """State and plans shared by `Limiter` and `asyncio.Limiter`; they add
    only the I/O (`_run`, which runs a Job's plan through `_send`) and
    the public methods' signatures."""

    def __init__(
        self,
        client: C,
        *,
        backend: Optional[BackendName] = None,
        timeout: Optional[float] = DEFAULT_TIMEOUT,
        on_error: OnError = "raise",
        denial_cache: Union[bool, int, DenialCache, None] = None,
        breaker: Union[Breaker, bool] = True,
        processes: int = 1,
        on_decision: Optional[OnDecision] = None,
    ) -> None:
        # The asyncio Limiter's _run is a coroutine function: it awaits its client.
        check_client(client, asyncio=inspect.iscoroutinefunction(getattr(self, "_run", None)))
        self.client = client
        self._cluster = isinstance(client, (RedisCluster, AsyncRedisCluster))
        self._encoding = client_encoding(client)  # how str keys reach Redis
        self._engine = Engine(backend, client if self._cluster else None)
        self.timeout = _check_timeout(timeout)
        self.on_error = _check_on_error(on_error)
        self.denial_cache: Optional[DenialCache] = make_denial_cache(denial_cache, self._encoding)
        if isinstance(breaker, Breaker):
            self.breaker: Optional[Breaker] = breaker
        elif breaker is True or breaker is False:
            self.breaker = Breaker() if breaker else None
        else:
            raise TypeError(f"breaker must be a Breaker, True (the default one) or False, got {breaker!r}")
        if not (isinstance(processes, int) and not isinstance(processes, bool) and processes >= 1):
            raise ValueError(f"processes must be an int >= 1, got {processes!r}")
        self.processes = processes
        if self.on_error == "local":
            _local.require()
        self._local: Optional[_local.LocalBuckets] = None
        self.on_decision = on_decision
        # The leases this limiter holds, as (key, id) in the bytes Redis
        # sees, with their weight: a retried acquire of a held id counts
        # once, and its Lease knows its own weight is in `in_use`.
        self._held: dict[tuple[bytes, bytes], int] = {}
        self._errors = _ErrorLog()
        # Made once: the hot path calls it directly.
        self._send = self._sender()

    @property
    def breaker_state(self) -> str:
        """ "closed", "open" or "half_open" ("closed" without a breaker)."""
        return self.breaker.state if self.breaker is not None else "closed"

    @property
    def leases_held(self) -> int:
        """How many leases this limiter holds now: acquired through it and
        not given back since. One counts from the acquire that takes it (a
        retried acquire of a held id counts once) until `release` is called
        for it, whatever the answer, or a renewal finds it lost."""
        return len(self._held)

    @property
    def backend(self) -> Optional[BackendName]:
        """The backend in use ("module", "functions" or "eval"); None until a call finds it."""
        return self._engine.backend

    # ---- requests: checked before anything is sent -----------------------

    def _check_one(self, op: BucketOp, key: KeyT, bucket: Bucket, amount: Any) -> OneRequest:
        key = check_key(key)
        _check_bucket(bucket)
        value = check_delta(amount) if op == "adjust" else check_cost(amount, bucket)
        return OneRequest(op, key, bucket, value)

    def _check_many(self, groups: Iterable[GroupIn], atomic: Optional[bool]) -> ManyRequest:
        # The module's order: the group count, each group left to right,
        # then duplicate keys; the first error wins.
        given = list(groups)
        if not given:
            raise InvalidArgument("groups", "consume_many needs at least one (key, bucket, cost)")
        checked = _check_groups(given)
        self._check_duplicates(checked)
        split = self._cluster and len(checked) > 1 and len({self._slot(k) for k, _, _ in checked}) > 1
        if split and atomic:
            slots = ", ".join(f"{k!r}: {self._slot(k)}" for k, _, _ in checked)
            raise CrossSlotError(
                f"atomic consume_many needs every key in one Cluster hash slot, got {slots}; "
                "put the shared part in a hash tag (redis_tokenbucket.hash_tagged) or pass atomic=None"
            )
        return ManyRequest(tuple(checked), each=split or atomic is False)

    def _check_duplicates(self, groups: Sequence[Group], lease_key: Optional[KeyT] = None) -> None:
        """The module's last checks: a bucket on the lease key, then a key
        in two groups."""
        if lease_key is not None:
            raw = key_bytes(lease_key, self._encoding)
            for i, (key, _, _) in enumerate(groups, 1):
                if key_bytes(key, self._encoding) == raw:
                    raise invalid("buckets", "bucket_is_lease_key", group=i)
        seen: dict[bytes, int] = {}
        for i, (key, _, _) in enumerate(groups, 1):
            raw = key_bytes(key, self._encoding)
            if raw in seen:
                raise invalid("key", "duplicate_key", group=i, first=seen[raw])
            seen[raw] = i

    def _check_acquire(
        self, key: KeyT, concurrency: Concurrency, weight: Any, buckets: Iterable[GroupIn], lease_id: Any
    ) -> LeaseRequest:
        # The module's order: the id, the weight, the buckets (their count,
        # each left to right), a bucket on the lease key, duplicates.
        key = check_key(key)
        if not isinstance(concurrency, Concurrency):
            raise TypeError(f"expected a Concurrency, got {type(concurrency).__name__}")
        lease_id = new_id() if lease_id is None else check_id(lease_id, self._encoding)
        weight = concurrency.check_weight(weight)
        groups = _check_groups(list(buckets))
        self._check_duplicates(groups, key)
        if self._cluster and groups and len({self._slot(k) for k in (key, *(k for k, _, _ in groups))}) > 1:
            slots = ", ".join(f"{k!r}: {self._slot(k)}" for k in (key, *(k for k, _, _ in groups)))
            raise CrossSlotError(
                f"acquire needs the lease key and its buckets in one Cluster hash slot, got {slots}; "
                "put the shared part in a hash tag (redis_tokenbucket.hash_tagged)"
            )
        head = (str(concurrency.limit), str(concurrency.lease_ms), lease_id, str(weight))
        return LeaseRequest("acquire", key, concurrency, lease_id, weight, groups, head)

    def _sender(self) -> Callable[[Command, Optional[float]], Any]:
        """What sends a command a plan yields, with its timeout: the sync
        and asyncio limiters each make theirs (_transport)."""
        raise NotImplementedError

    def _client_sender(self) -> Callable[[Command], Any]:
        """The client's own execute_command, for clients the limiter keeps
        no connections of (Cluster, fakeredis, ..., or timeout=None)."""
        execute: Callable[..., Any] = self.client.execute_command  # type: ignore[attr-defined]

        def send(command: Command) -> Any:
            if isinstance(command, Once):
                command = command.command
            if isinstance(command, ToNode):
                return execute(*command.args, target_nodes=command.node)
            return execute(*command)

        return send

    def _slot(self, key: KeyT) -> int:
        slot: int = self.client.keyslot(key)  # type: ignore[attr-defined]
        return slot

    def _options(self, timeout: Optional[float], on_error: Optional[OnError]) -> tuple[Optional[float], OnError]:
        return (
            self.timeout if timeout is None else _check_timeout(timeout),
            self.on_error if on_error is None else _check_on_error(on_error),
        )

    # ---- jobs: what the public methods run --------------------------------

    def _job_one(
        self,
        op: BucketOp,
        key: KeyT,
        bucket: Bucket,
        amount: Any,
        timeout: Optional[float],
        on_error: Optional[OnError],
    ) -> Job[Decision]:
        req = self._check_one(op, key, bucket, amount)
        options = self._options(timeout, on_error)
        if self.denial_cache is not None:
            cached = self._cached_one(req)
            if cached is not None:
                return Job(None, cached, ANSWER_ONE, req, options)
        return Job(self._plan_one(req), None, ANSWER_ONE, req, options)

    def _job_many(
        self, groups: Iterable[GroupIn], atomic: Optional[bool], timeout: Optional[float], on_error: Optional[OnError]
    ) -> Job[MultiDecision]:
        req = self._check_many(groups, atomic)
        options = self._options(timeout, on_error)
        cached = self._cached_many(req)
        if cached is not None:
            return Job(None, cached, ANSWER_MANY, req, options)
        return Job(self._plan_many(req), None, ANSWER_MANY, req, options)

    def _job_detect(self, probe_key: KeyT, timeout: Optional[float]) -> Job[str]:
        return Job(self._plan_detect(probe_key), None, ANSWER_NONE, "detect", self._options(timeout, "raise"))

    def _job_reset(self, key: KeyT, timeout: Optional[float]) -> Job[bool]:
        plan = self._plan_reset(check_key(key))
        return Job(plan, None, ANSWER_NONE, "reset", self._options(timeout, "raise"))

    def _job_acquire(
        self,
        key: KeyT,
        concurrency: Concurrency,
        weight: Any,
        buckets: Iterable[GroupIn],
        lease_id: Any,
        timeout: Optional[float],
        on_error: Optional[OnError],
    ) -> Job[Lease]:
        req = self._check_acquire(key, concurrency, weight, buckets, lease_id)
        return Job(self._plan_acquire(req), None, ANSWER_LEASE, req, self._options(timeout, on_error))

    def _job_renew(self, lease: Lease, timeout: Optional[float]) -> Job[bool]:
        req = _lease_request("renew", lease)
        options = self._options(timeout, "raise")
        if lease.held != "redis" or not lease.acquired:
            return Job(None, self._off_redis(req, lease), ANSWER_NONE, req, options)
        return Job(self._plan_renew(req, lease), None, ANSWER_NONE, req, options)

    def _job_release(self, lease: Lease, timeout: Optional[float]) -> Job[bool]:
        req = _lease_request("release", lease)
        options = self._options(timeout, "raise")
        if lease.acquired:
            # Given back now, whatever the answer: a release Redis can't
            # take leaves the lease to expire, and its holder holds it no more.
            self._held.pop(self._lease_ident(req), None)
        if lease.held != "redis" or not lease.acquired:
            return Job(None, self._off_redis(req, lease), ANSWER_NONE, req, options)
        return Job(self._plan_release(req, lease), None, ANSWER_NONE, req, options)

    def _job_inflight(self, key: KeyT, timeout: Optional[float]) -> Job[int]:
        key = check_key(key)
        req = LeaseRequest("inflight", key, None, "", 1, (), ())
        return Job(self._plan_inflight(req), None, ANSWER_NONE, req, self._options(timeout, "raise"))

    # ---- plans -----------------------------------------------------------

    def _cached_one(self, req: OneRequest) -> Optional[Decision]:
        if self.denial_cache is None or req.op == "adjust":
            return None
        return self.denial_cache.lookup_one(req.key, req.bucket, req.amount)

    def _cached_many(self, req: ManyRequest) -> Optional[MultiDecision]:
        if self.denial_cache is None:
            return None
        keys = tuple(k for k, _, _ in req.groups)
        hit = self.denial_cache.lookup(keys, [b for _, b, _ in req.groups], [c for _, _, c in req.groups])
        if hit is None:
            return None
        return MultiDecision(False, hit.retry_after_ms, hit.decisions, atomic=not req.each, cached=True)

    def _plan_one(self, req: OneRequest) -> Plan[Decision]:
        cache = self.denial_cache
        # Before anything is sent: a denial's deadline counts from here.
        ticket = cache.sent(req.op, (req.key,)) if cache is not None else None
        try:
            reply = yield from self._engine.call(req.op, ((req.key, req.bucket, req.amount),))
        except BaseException:
            if ticket is not None:
                ticket.failed()
            raise
        make = Decision.from_adjust if req.op == "adjust" else Decision.from_reply
        decision = make(reply, req.key, req.bucket, req.amount)
        if ticket is not None:
            ticket.answered(decision.allowed, decision.retry_after_ms, (decision,))
        return decision

    def _plan_many(self, req: ManyRequest) -> Plan[MultiDecision]:
        cache = self.denial_cache
        keys = [k for k, _, _ in req.groups]
        ticket = cache.sent("each" if req.each else "mconsume", keys) if cache is not None else None
        try:
            if req.each:
                result = yield from self._plan_each(req.groups)
            else:
                allowed, retry_ms, *replies = yield from self._engine.call("mconsume", req.groups)
                decisions = tuple(Decision.from_reply(r, *g) for r, g in zip(replies, req.groups, strict=True))
                result = MultiDecision(bool(allowed), int(retry_ms), decisions)
        except BaseException:
            if ticket is not None:
                ticket.failed()
            raise
        if ticket is not None:
            ticket.answered(result.allowed, result.retry_after_ms, result.decisions)
        return result

    def _plan_each(self, groups: Sequence[Group]) -> Plan[MultiDecision]:
        """All-or-nothing without TB.MCONSUME, for keys in several Cluster
        slots: charge bucket by bucket in order; when one denies, refund
        those already charged and peek at the rest, so the answer is the
        one TB.MCONSUME would give. Not atomic: until the refunds land,
        the refunded tokens are missing and a concurrent request can be
        denied for it; and if Redis fails between the charge and the
        refund, the charge stays."""
        charged: list[Decision] = []
        for i, (key, bucket, cost) in enumerate(groups):
            reply = yield from self._engine.call("consume", ((key, bucket, cost),))
            decision = Decision.from_reply(reply, key, bucket, cost)
            if decision.allowed:
                charged.append(decision)
                continue
            refunded = []
            for c in charged:
                if c.cost > 0:
                    reply = yield from self._engine.call("adjust", ((c.key, c.bucket, c.cost),))
                    # It could pay on its own, as TB.MCONSUME would report it;
                    # ADJUST's retry time (for cost 1) means nothing here.
                    c = replace(Decision.from_reply(reply, c.key, c.bucket, c.cost), retry_after_ms=0)
                refunded.append(c)
            rest = []
            for key, bucket, cost in groups[i + 1 :]:
                reply = yield from self._engine.call("peek", ((key, bucket, cost),))
                rest.append(Decision.from_reply(reply, key, bucket, cost))
            decisions = (*refunded, decision, *rest)
            return MultiDecision(False, max(d.retry_after_ms for d in decisions), decisions, atomic=False)
        return MultiDecision(True, 0, tuple(charged), atomic=False)

    def _plan_reset(self, key: KeyT) -> Plan[bool]:
        cache = self.denial_cache
        ticket = cache.sent("reset", (key,)) if cache is not None else None
        try:
            # No key is a full bucket. A cluster client routes DEL by its key.
            # Once: a DEL run twice could wipe charges made in between.
            deleted = yield Once(("DEL", key))
        except BaseException:
            if ticket is not None:
                ticket.failed()
            raise
        if ticket is not None:
            ticket.answered(True, 0, ())
        return bool(deleted)

    def _plan_acquire(self, req: LeaseRequest) -> Plan[Lease]:
        cache = self.denial_cache
        # The buckets it charges: cached denials of them are forgotten. An
        # acquire's own denial is never cached (a release can free a slot
        # at any time).
        ticket = cache.sent("acquire", [k for k, _, _ in req.groups]) if cache is not None and req.groups else None
        # A re-acquire of a lease this limiter holds: its weight is in in_use.
        own = self._held.get(self._lease_ident(req), 0)
        try:
            reply = yield from self._engine.call("acquire", req.groups, (req.key, req.head))
        except BaseException:
            if ticket is not None:
                ticket.failed()
            raise
        lease = _lease_from_reply(reply, req, degraded=False)
        lease.own_weight = own
        if ticket is not None:
            ticket.answered(lease.acquired, lease.retry_after_ms, lease.decisions)
        return lease

    def _plan_renew(self, req: LeaseRequest, lease: Lease) -> Plan[bool]:
        renewed, expires_ms = yield from self._engine.call("renew", (), (req.key, req.head))
        return self._renewed(req, lease, bool(renewed), int(expires_ms))

    def _renewed(self, req: LeaseRequest, lease: Lease, renewed: bool, expires_ms: int) -> bool:
        if renewed:
            lease.expires_in_ms = expires_ms
        else:
            lease.lost = True  # expired, or released by another: no longer held
            self._held.pop(self._lease_ident(req), None)
        return renewed

    def _plan_release(self, req: LeaseRequest, lease: Lease) -> Plan[bool]:
        released, _ = yield from self._engine.call("release", (), (req.key, req.head))
        lease.released = True
        return bool(released)

    def _plan_inflight(self, req: LeaseRequest) -> Plan[int]:
        in_use = yield from self._engine.call("inflight", (), (req.key, ()))
        return int(in_use)

    def _off_redis(self, req: LeaseRequest, lease: Lease) -> bool:
        """Renewing or releasing a lease that holds no slot in Redis: a
        denied one (nothing to do), one admitted by on_error="open" (no
        slot anywhere: renewing keeps it, releasing ends it), or one of the
        in-process fallback (on_error="local"), which answers for it."""
        if not lease.acquired:
            return False
        if lease.held == "local":
            reply = self._local_buckets().run_lease(req.op, req.key, req.head, ())
            if req.op == "renew":
                return self._renewed(req, lease, bool(reply[0]), int(reply[1]))
            lease.released = True
            return bool(reply[0])
        if req.op == "renew":
            if lease.released:
                lease.lost = True  # one meaning for `lost`, in Redis or not
                return False
            return True
        released = not lease.released
        lease.released = True
        return released

    def _plan_detect(self, probe_key: KeyT) -> Plan[str]:
        yield from self._engine.call("peek", ((probe_key, _PROBE, 1.0),))
        return self._engine.backend or ""

    # ---- the failure policy ----------------------------------------------

    def _failed(self, exc: Exception, job: Job[T], probe: bool) -> T:
        """What an error of a call means (_transport.classify): a usage
        error is raised, local overload sheds, a Redis failure counts for
        the breaker and gets the job's policy."""
        kind = classify(exc)
        breaker = self.breaker
        if kind == "usage":
            if breaker is not None:
                breaker.success(probe)  # Redis answered, if only to refuse
            raise exc
        if kind == "shed":
            if breaker is not None:
                breaker.release(probe)
            job.source = ""
            return job.answers.shed(job.req)
        if breaker is not None:
            breaker.failure(probe)
        return self._policy(job, exc)

    def _policy(self, job: Job[T], exc: Exception) -> T:
        """The job's answer while Redis is failing (`exc`), logged."""
        if job.on_error == "raise":
            raise exc
        self._errors.report(exc, job.on_error, job.what)
        if job.on_error == "local":
            job.source = "local"
            return job.answers.local(self._local_buckets(), job.req)
        job.source = ""
        return job.answers.policy(job.req, job.on_error == "open")

    def _upkeep(self, job: Job[Any]) -> bool:
        """A lease's renewal or release: sent even while the breaker is open
        (a stream that ends must free its slot at once, and Redis may well
        be there), within its budget, and never counted for the breaker."""
        req = job.req
        return isinstance(req, LeaseRequest) and req.op in ("renew", "release")

    def _upkeep_failed(self, exc: Exception, job: Job[Any]) -> NoReturn:
        """A renewal's or release's error is raised: no policy answers for it."""
        if classify(exc) == "shed" and not isinstance(exc, Shed):
            raise Shed(f"too busy to get Redis's answer in time for {job.what}") from exc
        raise exc

    def _unanswered(self, job: Job[Any], exc: Exception) -> Optional[Plan[Any]]:
        """The best-effort release of an acquire that got no answer (Redis
        failing, or a shed of a command already handed to the client): it
        may have taken its slot all the same (a timeout after the write, a
        connection lost with the command on it), and only this process
        knows the id. None for any other call or error."""
        req = job.req
        if not (isinstance(req, LeaseRequest) and req.op == "acquire"):
            return None
        if not isinstance(exc, Shed) and classify(exc) != "failure":
            return None
        return self._engine.call("release", (), (req.key, (req.id,)))

    def _open_circuit(self, job: Job[T]) -> T:
        """The breaker is open: the policy at once, no network."""
        exc = CircuitOpenError(f"Redis failed {self.breaker.failures if self.breaker else 0} times lately")
        return self._policy(job, exc)

    def _budget(self, job: Job[Any]) -> Optional[float]:
        timeout = job.timeout
        if timeout is not None and timeout < DETECT_TIMEOUT and self._engine.backend is None:
            return DETECT_TIMEOUT
        return timeout

    def _local_buckets(self) -> _local.LocalBuckets:
        if self._local is None:
            self._local = _local.LocalBuckets(self.processes)
        return self._local

    def _lease_ident(self, req: LeaseRequest) -> tuple[bytes, bytes]:
        return key_bytes(req.key, self._encoding), key_bytes(req.id, self._encoding)

    def _settled(self, job: Job[T], result: T, started: float) -> T:
        """Counts a lease an acquire took as held, and reports a decision
        to the on_decision hook (never raising into the call)."""
        req = job.req
        if isinstance(req, LeaseRequest) and req.op == "acquire" and cast(Lease, result).acquired:
            self._held[self._lease_ident(req)] = req.weight
        hook = self.on_decision
        if hook is None:
            return result
        latency = time.perf_counter() - started
        op: str
        if isinstance(req, OneRequest):
            op, names = req.op, req.bucket.name or ""
        elif isinstance(req, ManyRequest):
            op, names = "consume_many", ",".join(b.name or "" for _, b, _ in req.groups).strip(",")
        elif isinstance(req, LeaseRequest) and req.op == "acquire" and req.concurrency is not None:
            op = "acquire"
            names = ",".join([req.concurrency.name or "", *(b.name or "" for _, b, _ in req.groups)]).strip(",")
        else:
            return result  # detect(), reset() and a lease's upkeep: not decisions
        backend = job.source if job.source is not None else (self._engine.backend or "")
        d: Any = result
        allowed = d.acquired if isinstance(d, Lease) else d.allowed
        cached = getattr(d, "cached", False)
        event = DecisionEvent(op, names, allowed, d.degraded, d.shed, cached, backend, latency, self.breaker_state)
        try:
            hook(event)
        except Exception:
            log.exception("rate limiter: the on_decision hook raised; the decision stands")
        return result


def _degraded_one(req: OneRequest, allowed: bool) -> Decision:
    return Decision(allowed, 0, 0, 0, req.key, req.bucket, req.amount, degraded=True)


def _degraded_many(req: ManyRequest, allowed: bool) -> MultiDecision:
    decisions = tuple(Decision(allowed, 0, 0, 0, k, b, c, degraded=True) for k, b, c in req.groups)
    return MultiDecision(allowed, 0, decisions, atomic=not req.each, degraded=True)


def _shed_one(req: OneRequest) -> Decision:
    return Decision(False, 0, SHED_RETRY_MS, 0, req.key, req.bucket, req.amount, shed=True)


def _shed_many(req: ManyRequest) -> MultiDecision:
    decisions = tuple(Decision(False, 0, SHED_RETRY_MS, 0, k, b, c, shed=True) for k, b, c in req.groups)
    return MultiDecision(False, SHED_RETRY_MS, decisions, atomic=not req.each, shed=True)


def _local_one(local: _local.LocalBuckets, req: OneRequest) -> Decision:
    try:
        reply = local.run(req.op, ((req.key, req.bucket, req.amount),))
    except ResponseError:  # a cost above this process's share of max: it can't pass here
        return _degraded_one(req, False)
    allowed, remaining, retry_ms, reset_ms = reply
    return Decision(bool(allowed), remaining, retry_ms, reset_ms, req.key, req.bucket, req.amount, degraded=True)


def _local_many(local: _local.LocalBuckets, req: ManyRequest) -> MultiDecision:
    try:
        allowed, retry_ms, *replies = local.run("mconsume", req.groups)
    except ResponseError:
        return _degraded_many(req, False)
    decisions = tuple(
        Decision(bool(a), r, w, t, k, b, c, degraded=True)
        for (a, r, w, t), (k, b, c) in zip(replies, req.groups, strict=True)
    )
    return MultiDecision(bool(allowed), retry_ms, decisions, atomic=not req.each, degraded=True)


def _lease_from_reply(reply: Sequence[Any], req: LeaseRequest, degraded: bool) -> Lease:
    acquired, in_use, retry_ms, expires_ms, *replies = reply
    decisions = tuple(
        Decision(bool(a), int(r), int(w), int(t), k, b, c, degraded=degraded)
        for (a, r, w, t), (k, b, c) in zip(replies, req.groups, strict=True)
    )
    assert req.concurrency is not None
    held: Held = ("local" if degraded else "redis") if acquired else "none"
    return Lease(
        bool(acquired), int(in_use), int(retry_ms), int(expires_ms), req.id, req.key, req.concurrency,
        req.weight, decisions, degraded=degraded, held=held,
    )  # fmt: skip


def _degraded_lease(req: LeaseRequest, allowed: bool) -> Lease:
    assert req.concurrency is not None
    decisions = tuple(Decision(allowed, 0, 0, 0, k, b, c, degraded=True) for k, b, c in req.groups)
    return Lease(allowed, 0, 0, 0, req.id, req.key, req.concurrency, req.weight, decisions, degraded=True, held="none")


def _shed_lease(req: LeaseRequest) -> Lease:
    assert req.concurrency is not None
    decisions = tuple(Decision(False, 0, SHED_RETRY_MS, 0, k, b, c, shed=True) for k, b, c in req.groups)
    return Lease(
        False, 0, SHED_RETRY_MS, 0, req.id, req.key, req.concurrency, req.weight, decisions, shed=True, held="none"
    )


def _local_lease(local: _local.LocalBuckets, req: LeaseRequest) -> Lease:
    """The in-process fallback's answer: a semaphore of this process's share
    of the limit (and of each bucket), run by the package's Lua library."""
    try:
        reply = local.run_lease("acquire", req.key, req.head, req.groups)
    except ResponseError:  # a weight above this process's share of the limit: it can't fit here
        return _degraded_lease(req, False)
    lease = _lease_from_reply(reply, req, degraded=True)
    assert req.concurrency is not None
    # What it was decided against: this process's share (its `busy` and
    # `remaining` are about that).
    lease.concurrency = replace(req.concurrency, limit=_local.share_limit(req.concurrency.limit, local.processes))
    return lease


def _no_answer(req: object, *_: object) -> Any:
    raise LimiterError(f"{describe(req)}() has no answer without Redis")  # type: ignore[arg-type]


def _shed_detect(req: object) -> Any:
    raise Shed(f"too busy to get Redis's answer in time for {describe(req)}")  # type: ignore[arg-type]


ANSWER_ONE: Answers[Decision] = Answers(_degraded_one, _local_one, _shed_one)
ANSWER_MANY: Answers[MultiDecision] = Answers(_degraded_many, _local_many, _shed_many)
ANSWER_NONE: Answers[Any] = Answers(_no_answer, _no_answer, _shed_detect)
ANSWER_LEASE: Answers[Lease] = Answers(_degraded_lease, _local_lease, _shed_lease)


def _check_groups(given: list[Any]) -> list[Group]:
    """Buckets given as (key, bucket) or (key, bucket, cost), checked in the
    module's order: their count, then each left to right."""
    if len(given) > MAX_GROUPS:
        raise invalid("groups", "too_many_groups")
    checked: list[Group] = []
    for i, group in enumerate(given, 1):
        key, bucket, *cost = group
        key = check_key(key, i)
        _check_bucket(bucket, i)
        if len(cost) > 1:
            raise ValueError(f"group {i}: expected (key, bucket) or (key, bucket, cost)")
        checked.append((key, bucket, check_cost(cost[0] if cost else 1, bucket, i)))
    return checked


def _lease_request(op: Op, lease: Lease) -> LeaseRequest:
    if not isinstance(lease, Lease):
        raise TypeError(f"expected a Lease (what acquire returns), got {type(lease).__name__}")
    head: Args = (lease.id, str(lease.concurrency.lease_ms)) if op == "renew" else (lease.id,)
    return LeaseRequest(op, lease.key, lease.concurrency, lease.id, lease.weight, (), head)


def _check_bucket(bucket: Any, group: Optional[int] = None) -> None:
    if not isinstance(bucket, Bucket):
        where = "" if group is None else f" (group {group})"
        raise TypeError(f"expected a Bucket{where}, got {type(bucket).__name__}")


def _check_timeout(timeout: Optional[float]) -> Optional[float]:
    number = isinstance(timeout, (int, float)) and not isinstance(timeout, bool)
    if timeout is not None and not (number and 0 < timeout < 1e9):
        raise ValueError("timeout must be > 0 seconds (and finite), or None for the client's own timeouts")
    return None if timeout is None else float(timeout)


def _check_on_error(on_error: str) -> OnError:
    for policy in ON_ERROR:
        if on_error == policy:
            return policy
    raise ValueError(f"on_error must be one of {', '.join(ON_ERROR)}, got {on_error!r}")


def describe(req: Union[OneRequest, ManyRequest, LeaseRequest, str]) -> str:
    """What a log line says the degraded call was about."""
    if isinstance(req, str):
        return req
    if isinstance(req, (OneRequest, LeaseRequest)):
        return f"{req.op} {req.key!r}"
    return "consume_many " + ", ".join(repr(k) for k, _, _ in req.groups)
