"""The limiter: its state and the parts it owns. A call is made a Job by
the requests (_requests: the checks, the commands, the denial cache, the
leases held), whose plan runs on the backend the engine finds (_engine)
under the failure policy (_policy: the breaker, shedding, the answers
without Redis), its commands sent by the transport (_transport), and its
answer reported to the on_decision hook. `Limiter` (_sync) and
`asyncio.Limiter` add the public methods and drive the plan, blocking or
awaited. The Node package's twin is limiter.ts.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Generic, Optional, TypeVar, Union, cast

from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster

from . import _local
from ._breaker import Breaker
from ._cache import DenialCache
from ._cache import denial_cache as make_denial_cache
from ._clients import check_client
from ._decision import Decision, MultiDecision
from ._engine import BackendName, Engine
from ._events import DEFAULT_NEAR_LIMIT_RATIO, DecisionEvent, Outcome
from ._keys import client_encoding
from ._lease import Lease
from ._policy import FailurePolicy
from ._requests import (
    Job,
    LeaseRequest,
    ManyRequest,
    OneRequest,
    OnError,
    Options,
    Requests,
    check_on_error,
    check_timeout,
)
from ._transport import AsyncTransport, SyncTransport

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


class LimiterBase(Generic[C]):
    """State shared by `Limiter` and `asyncio.Limiter`, and the parts it is
    composed of: the engine (the backend and its commands), the requests
    (each call checked and made a Job, its plan on the engine), the
    failure policy (a Job run through the breaker, the answers without
    Redis) and the transport (how commands reach Redis). The two limiters
    add only the public methods and `_run`, which drives a Job's plan
    under the policy through the transport, blocking or awaited."""

    _transport_class: type[Union[SyncTransport, AsyncTransport]]

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
        shadow: bool = False,
        near_limit_ratio: float = DEFAULT_NEAR_LIMIT_RATIO,
    ) -> None:
        if not isinstance(shadow, bool):
            raise TypeError(f"shadow must be True or False, got {shadow!r}")
        self.shadow = shadow
        self.near_limit_ratio = check_ratio(near_limit_ratio)
        check_client(client, asyncio=self._transport_class.asyncio)
        self.client = client
        cluster = isinstance(client, (RedisCluster, AsyncRedisCluster))
        encoding = client_encoding(client)  # how str keys reach Redis
        self.wait_replicas, self.wait_timeout = check_wait(wait_replicas, wait_timeout, cluster)
        wait = ("WAIT", self.wait_replicas, wait_ms(self.wait_timeout)) if self.wait_replicas else None
        self._engine = Engine(backend, client if cluster else None, wait)
        self.timeout = check_timeout(timeout)
        self.on_error = check_on_error(on_error)
        cache = make_denial_cache(denial_cache, encoding)
        if isinstance(breaker, Breaker):
            chosen: Optional[Breaker] = breaker
        elif breaker is True or breaker is False:
            chosen = Breaker() if breaker else None
        else:
            raise TypeError(f"breaker must be a Breaker, True (the default one) or False, got {breaker!r}")
        if not (isinstance(processes, int) and not isinstance(processes, bool) and processes >= 1):
            raise ValueError(f"processes must be an int >= 1, got {processes!r}")
        if self.on_error == "local":
            _local.require()
        self.on_decision = on_decision
        self._policy = FailurePolicy(self._engine, chosen, processes)
        self._requests = Requests(client, self._engine, cluster, encoding, cache, self._policy.local_buckets)
        self._transport = self._transport_class(client, self.timeout)

    @property
    def breaker(self) -> Optional[Breaker]:
        """The circuit breaker (None without one)."""
        return self._policy.breaker

    @breaker.setter
    def breaker(self, breaker: Optional[Breaker]) -> None:
        self._policy.breaker = breaker

    @property
    def breaker_state(self) -> str:
        """ "closed", "open" or "half_open" ("closed" without a breaker)."""
        return self.breaker.state if self.breaker is not None else "closed"

    @property
    def processes(self) -> int:
        """How many processes share each limit, for on_error="local"."""
        return self._policy.processes

    @processes.setter
    def processes(self, processes: int) -> None:
        self._policy.processes = processes

    @property
    def denial_cache(self) -> Optional[DenialCache]:
        """The denial cache (None when off)."""
        return self._requests.denial_cache

    @denial_cache.setter
    def denial_cache(self, cache: Optional[DenialCache]) -> None:
        self._requests.denial_cache = cache

    @property
    def leases_held(self) -> int:
        """How many leases this limiter holds now: acquired through it and
        not given back since. One counts from the acquire that takes it (a
        retried acquire of a held id counts once) until `release` is called
        for it, whatever the answer, or a renewal finds it lost."""
        return len(self._requests.held)

    @property
    def backend(self) -> Optional[BackendName]:
        """The backend in use ("module", "functions" or "eval"); None until a call finds it."""
        return self._engine.backend

    def _options(self, timeout: Optional[float], on_error: Optional[OnError]) -> Options:
        """A call's timeout and policy: its own, else the limiter's."""
        return (
            self.timeout if timeout is None else check_timeout(timeout),
            self.on_error if on_error is None else check_on_error(on_error),
        )

    def _budget(self, job: Job[Any]) -> Optional[float]:
        timeout = job.timeout
        if timeout is None:
            return None
        if timeout < DETECT_TIMEOUT and self._engine.backend is None:
            timeout = DETECT_TIMEOUT
        if self.wait_replicas and _writes(job.req):
            timeout += self.wait_timeout  # the WAIT behind it is in the call's budget
        return timeout

    def _settled(self, job: Job[T], result: T, started: float, shadow: Optional[bool] = None) -> T:
        """Counts a lease an acquire took as held, lets a shadow call's
        denial through, and reports a decision to the on_decision hook
        (never raising into the call)."""
        req = job.req
        if isinstance(req, LeaseRequest) and req.op == "acquire":
            self._requests.took(req, cast(Lease, result))
        if (self.shadow if shadow is None else shadow) and _shadowed(req):
            result = cast(T, self._let_through(result))
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
        outcome, rule = self._judged(d)
        event = DecisionEvent(
            op, names, allowed, d.degraded, d.shed, cached, backend, latency, self.breaker_state, outcome, rule
        )
        try:
            hook(event)
        except Exception:
            log.exception("rate limiter: the on_decision hook raised; the decision stands")
        return result

    @staticmethod
    def _let_through(d: Any) -> Any:
        """A bucket's denial as shadow mode answers it: admitted, marked
        shadow, no wait. A denial nothing counted (shed, or the failure
        policy's "closed") stands: on_error decides those, not the limit."""
        if d.allowed or d.shed or (d.degraded and d.retry_after_ms == 0):
            return d
        log.info("rate limiter: shadow mode let through a request %s would deny", d.rule or "a rule")
        return replace(d, allowed=True, retry_after_ms=0, shadow=True)

    def _judged(self, d: Union[Decision, MultiDecision, Lease]) -> tuple[Outcome, str]:
        """The event's outcome and the name of the rule that decided."""
        if isinstance(d, Lease):
            decisions: tuple[Decision, ...] = d.decisions
            # A bucket decided only when it denied and a slot was free.
            rule = None if not d.acquired and not d.busy and d.denied_by else d.concurrency.name
            used = [(float(d.in_use), float(d.concurrency.limit))]
            allowed, shadow = d.acquired, False
        else:
            decisions = d.decisions if isinstance(d, MultiDecision) else (d,)
            rule, used, allowed, shadow = None, [], d.allowed, d.shadow
        if rule is None and decisions:
            rule = MultiDecision(allowed, 0, decisions).tightest.bucket.name
        if shadow:
            return "shadow_mode", rule or ""
        if not allowed:
            return "over_limit", rule or ""
        if d.degraded:
            return "within_limit", rule or ""
        used += [(x.bucket.max - x.remaining, x.bucket.max) for x in decisions]
        near = any(u >= self.near_limit_ratio * m for u, m in used)
        return ("near_limit" if near else "within_limit"), rule or ""


def _shadowed(req: object) -> bool:
    """Whether shadow mode lets a call's denial through: a charge (peek,
    adjust and leases are never shadowed)."""
    return isinstance(req, ManyRequest) or (isinstance(req, OneRequest) and req.op == "consume")


def check_ratio(ratio: Any) -> float:
    """The `near_limit_ratio` option, checked."""
    number = isinstance(ratio, (int, float)) and not isinstance(ratio, bool)
    if not (number and 0 < ratio <= 1):
        raise ValueError(f"near_limit_ratio must be a number in (0, 1], got {ratio!r}")
    return float(ratio)


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
