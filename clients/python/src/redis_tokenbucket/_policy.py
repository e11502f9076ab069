"""The failure policy (docs/failure-model.md): how a Job runs through the
breaker, and what the call answers when Redis can't. An error is
classified (_classify): a usage error is raised, local overload sheds
(refused, never admitted, never counted), a Redis failure counts for the
breaker and gets the call's policy: "raise", "open" (admitted,
degraded), "closed" (denied, degraded), "local" (the process's own
buckets, _local).
Releases and renewals of leases are sent whatever the breaker says and
never count for it; an acquire that got no answer is followed by a
best-effort release of its id. The Node package's twin is policy.ts;
clients/spec holds the scenarios all the clients run.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import replace
from typing import Any, Generic, NoReturn, Optional, TypeVar, cast

from redis.exceptions import ResponseError

from . import _local
from ._breaker import PROBE, SKIP, Breaker
from ._classify import classify
from ._decision import Decision, MultiDecision
from ._engine import Engine, Plan
from ._errors import CircuitOpenError, LimiterError, Shed
from ._lease import Lease
from ._local import LocalBuckets
from ._requests import Job, LeaseRequest, ManyRequest, OneRequest, OnError, describe, lease_from_reply

log = logging.getLogger("redis_tokenbucket")

T = TypeVar("T")

# What a shed decision tells the client to wait (HTTP Retry-After: 1).
SHED_RETRY_MS = 1000


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


def answers_of(job: Job[T]) -> Answers[T]:
    """How this Job's kind of call answers without Redis."""
    req = job.req
    if isinstance(req, OneRequest):
        return cast(Answers[T], ANSWER_ONE)
    if isinstance(req, ManyRequest):
        return cast(Answers[T], ANSWER_MANY)
    if isinstance(req, LeaseRequest) and req.op == "acquire":
        return cast(Answers[T], ANSWER_LEASE)
    return cast(Answers[T], ANSWER_NONE)


_OUTCOME = {"open": "admitted", "closed": "denied", "local": "local buckets", "raise": "raised"}


class ErrorLog:
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


class FailurePolicy:
    """How a Job runs against Redis, through the breaker, and what it
    answers when Redis can't: owned by the limiter (_limiter), with the
    breaker, the in-process buckets of "local", and the error log."""

    def __init__(self, engine: Engine, breaker: Optional[Breaker], processes: int) -> None:
        self.engine = engine
        self.breaker = breaker
        self.processes = processes
        self.errors = ErrorLog()
        self._local: Optional[LocalBuckets] = None

    def run(self, job: Job[T]) -> Plan[T]:
        """The job's plan under the policy: a plan too, so that the sync and
        asyncio limiters each drive it with their own I/O."""
        plan = job.plan
        assert plan is not None, "a job answered without a round trip has no plan to run"
        if _upkeep(job):  # outside the breaker
            try:
                return (yield from plan)
            except Exception as exc:
                _upkeep_failed(exc, job)
        breaker = self.breaker
        mode = breaker.enter() if breaker is not None else 0
        if mode == SKIP:
            return self._open_circuit(job)
        try:
            result = yield from plan
        except Exception as exc:
            release = self._unanswered(job, exc)
            if release is not None:
                # Best effort: a release Redis can't take leaves the lease to
                # expire within its lease_ms, as a crashed holder's would.
                with suppress(Exception):
                    yield from release
            return self._failed(exc, job, mode == PROBE)
        if breaker is not None and mode:
            breaker.success(True)
        return result

    def _failed(self, exc: Exception, job: Job[T], probe: bool) -> T:
        """What an error of a call means (_classify): a usage error is
        raised, local overload sheds, a Redis failure counts for the
        breaker and gets the job's policy."""
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
            return answers_of(job).shed(job.req)
        if breaker is not None:
            breaker.failure(probe)
        return self._policy(job, exc)

    def _policy(self, job: Job[T], exc: Exception) -> T:
        """The job's answer while Redis is failing (`exc`), logged."""
        if job.on_error == "raise":
            raise exc
        self.errors.report(exc, job.on_error, job.what)
        if job.on_error == "local":
            job.source = "local"
            return answers_of(job).local(self.local_buckets(), job.req)
        job.source = ""
        return answers_of(job).policy(job.req, job.on_error == "open")

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
        return self.engine.call("release", (), (req.key, (req.id,)))

    def _open_circuit(self, job: Job[T]) -> T:
        """The breaker is open: the policy at once, no network."""
        exc = CircuitOpenError(f"Redis failed {self.breaker.failures if self.breaker else 0} times lately")
        return self._policy(job, exc)

    def local_buckets(self) -> LocalBuckets:
        """The in-process buckets of on_error="local", made on first use."""
        if self._local is None:
            self._local = _local.LocalBuckets(self.processes)
        return self._local


def _upkeep(job: Job[Any]) -> bool:
    """A lease's renewal or release: sent even while the breaker is open
    (a stream that ends must free its slot at once, and Redis may well
    be there), within its budget, and never counted for the breaker."""
    req = job.req
    return isinstance(req, LeaseRequest) and req.op in ("renew", "release")


def _upkeep_failed(exc: Exception, job: Job[Any]) -> NoReturn:
    """A renewal's or release's error is raised: no policy answers for it."""
    if classify(exc) == "shed" and not isinstance(exc, Shed):
        raise Shed(f"too busy to get Redis's answer in time for {job.what}") from exc
    raise exc


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
        reply = local.run(req.op, ((req.key, req.bucket, req.amount),), req.after)
    except ResponseError:  # a cost above this process's share of max: it can't pass here
        return _degraded_one(req, False)
    allowed, remaining, retry_ms, reset_ms = reply
    return Decision(bool(allowed), remaining, retry_ms, reset_ms, req.key, req.bucket, req.amount, degraded=True)


def _local_many(local: _local.LocalBuckets, req: ManyRequest) -> MultiDecision:
    try:
        allowed, retry_ms, *replies = local.run("mconsume", req.groups, req.after)
    except ResponseError:
        return _degraded_many(req, False)
    decisions = tuple(
        Decision(bool(a), r, w, t, k, b, c, degraded=True)
        for (a, r, w, t), (k, b, c) in zip(replies, req.groups, strict=True)
    )
    return MultiDecision(bool(allowed), retry_ms, decisions, atomic=not req.each, degraded=True)


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
    lease = lease_from_reply(reply, req, degraded=True)
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
