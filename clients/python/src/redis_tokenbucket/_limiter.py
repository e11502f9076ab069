"""The limiter: its state, the public calls' shared part (`Limiter` and
`asyncio.Limiter` add the I/O and the signatures), each call made a Job
(_requests: the checks, the commands, the denial cache), run under the
failure policy (_policy: the breaker, shedding, the answers without
Redis) on the backend the engine finds (_engine), and reported to the
on_decision hook. How commands reach Redis is _transport. The Node
package's twin is limiter.ts.
"""

from __future__ import annotations

import inspect
import logging
import math
import time
from collections.abc import Callable
from typing import Any, Generic, Optional, TypeVar, Union, cast

from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster

from . import _local
from ._breaker import Breaker
from ._cache import DenialCache
from ._cache import denial_cache as make_denial_cache
from ._clients import check_client
from ._commands import Command, Once, ToNode, Waited
from ._engine import BackendName, Engine
from ._events import DecisionEvent
from ._keys import client_encoding
from ._lease import Lease
from ._policy import ErrorLog, FailurePolicy
from ._requests import (
    Job,
    LeaseRequest,
    ManyRequest,
    OneRequest,
    OnError,
    Requests,
    check_on_error,
    check_timeout,
    lease_request,
)

log = logging.getLogger("redis_tokenbucket")

T = TypeVar("T")
C = TypeVar("C")

# The limiter's budget for Redis to answer a command, from when it is
# written (seconds): a request path's, not a batch job's. None turns it off.
DEFAULT_TIMEOUT = 0.1
# While the backend is unknown (the first calls, or after a reply said it
# is gone), a call may load the Lua library, which Redis compiles: many
# gateways' first requests at once can keep it busy past a request-path
# budget. Such calls get at least this budget (seconds).
DETECT_TIMEOUT = 1.0

# How long WAIT may wait for the replicas by default (seconds), with
# `wait_replicas`: a request path's budget, not a batch job's.
DEFAULT_WAIT_TIMEOUT = 0.05

OnDecision = Callable[[DecisionEvent], None]


class LimiterBase(Requests, FailurePolicy, Generic[C]):
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
        wait_replicas: int = 0,
        wait_timeout: float = DEFAULT_WAIT_TIMEOUT,
    ) -> None:
        # The asyncio Limiter's _run is a coroutine function: it awaits its client.
        check_client(client, asyncio=inspect.iscoroutinefunction(getattr(self, "_run", None)))
        self.client = client
        self._cluster = isinstance(client, (RedisCluster, AsyncRedisCluster))
        self._encoding = client_encoding(client)  # how str keys reach Redis
        self.wait_replicas, self.wait_timeout = check_wait(wait_replicas, wait_timeout, self._cluster)
        wait = ("WAIT", self.wait_replicas, wait_ms(self.wait_timeout)) if self.wait_replicas else None
        self._engine = Engine(backend, client if self._cluster else None, wait)
        self.timeout = check_timeout(timeout)
        self.on_error = check_on_error(on_error)
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
        self._errors = ErrorLog()
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

    def _sender(self) -> Callable[[Command, Optional[float]], Any]:
        """What sends a command a plan yields, with its timeout: the sync
        and asyncio limiters each make theirs (_transport)."""
        raise NotImplementedError

    def _client_sender(self) -> Callable[[Command], Any]:
        """The client's own execute_command, for clients the limiter keeps
        no connections of (Cluster, fakeredis, ..., or timeout=None)."""
        execute: Callable[..., Any] = self.client.execute_command

        def send(command: Command) -> Any:
            if isinstance(command, Once):
                command = command.command
            if isinstance(command, ToNode):
                return execute(*command.args, target_nodes=command.node)
            if isinstance(command, Waited):
                return self._waited(command)
            return execute(*command)

        return send

    def _waited(self, command: Waited) -> Any:
        """A command with WAIT behind it, on a client the limiter keeps no
        connections of: one pipeline, the sync and asyncio limiters each
        their own."""
        raise NotImplementedError

    def _job_renew(self, lease: Lease, timeout: Optional[float]) -> Job[bool]:
        req = lease_request("renew", lease)
        options = self._options(timeout, "raise")
        if lease.held != "redis" or not lease.acquired:
            return Job(None, self._off_redis(req, lease), req, options)
        return Job(self._plan_renew(req, lease), None, req, options)

    def _job_release(self, lease: Lease, timeout: Optional[float]) -> Job[bool]:
        req = lease_request("release", lease)
        options = self._options(timeout, "raise")
        if lease.acquired:
            # Given back now, whatever the answer: a release Redis can't
            # take leaves the lease to expire, and its holder holds it no more.
            self._held.pop(self._lease_ident(req), None)
        if lease.held != "redis" or not lease.acquired:
            return Job(None, self._off_redis(req, lease), req, options)
        return Job(self._plan_release(req, lease), None, req, options)

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

    def _budget(self, job: Job[Any]) -> Optional[float]:
        timeout = job.timeout
        if timeout is None:
            return None
        if timeout < DETECT_TIMEOUT and self._engine.backend is None:
            timeout = DETECT_TIMEOUT
        if self.wait_replicas and _writes(job.req):
            timeout += self.wait_timeout  # the WAIT behind it is in the call's budget
        return timeout

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


def _writes(req: object) -> bool:
    """Whether a call can take a token or a slot (WAIT goes behind it)."""
    if isinstance(req, OneRequest):
        return req.op == "consume"
    if isinstance(req, LeaseRequest):
        return req.op == "acquire"
    return isinstance(req, ManyRequest)


def check_wait(replicas: Any, timeout: Any, cluster: bool) -> tuple[int, float]:
    """The `wait_replicas` and `wait_timeout` options, checked."""
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 0:
        raise ValueError(f"wait_replicas must be an int >= 0 (0: off), got {replicas!r}")
    number = isinstance(timeout, (int, float)) and not isinstance(timeout, bool)
    if not (number and 0 < timeout < 1e9):
        raise ValueError(f"wait_timeout must be > 0 seconds (and finite), got {timeout!r}")
    if replicas and cluster:
        raise ValueError(
            "wait_replicas is for one primary and its replicas: on a Redis Cluster, WAIT counts the "
            "replicas of the one node a command went to, so it can't be asked of the limiter"
        )
    return replicas, float(timeout)


def wait_ms(timeout: float) -> int:
    """WAIT's timeout in whole ms, rounded up, at least 1 (WAIT 0 waits forever)."""
    return max(1, math.ceil(round(timeout * 1000, 6)))
