"""The blocking Limiter, over redis.Redis or redis.cluster.RedisCluster."""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Iterable
from typing import Any, Callable, Optional, TypeVar, Union

from redis import Redis
from redis.cluster import RedisCluster

from ._bucket import Bucket, KeyT
from ._cache import DenialCache
from ._core import PROBE_KEY, BackendName, GroupIn, LimiterBase, OnError, Plan, describe
from ._decision import Decision, MultiDecision

T = TypeVar("T")


def drive(plan: Plan[T], execute: Callable[..., Any]) -> T:
    """Runs a plan with blocking calls."""
    try:
        args = next(plan)
        while True:
            try:
                reply = execute(*args)
            except Exception as exc:  # the plan decides what an error means
                args = plan.throw(exc)
            else:
                args = plan.send(reply)
    except StopIteration as done:
        result: T = done.value
        return result


class Limiter(LimiterBase):
    """Token buckets in Redis, with blocking calls.

    ``Limiter(redis.Redis())`` or ``Limiter(redis.cluster.RedisCluster(...))``.

    - ``backend``: force "module", "functions" or "eval"; by default the
      first call finds it (TB.* commands, else the Functions library,
      loaded if missing, else the EVAL scripts), and again whenever a reply
      says it is gone.
    - ``timeout``: seconds a call may take, Redis round trips and backend
      detection included. A blocking client can't abandon a command, so a
      call with a timeout runs on a helper thread and the caller stops
      waiting for it; the connection is freed when the reply or the
      client's socket timeout comes. None: the client's own timeouts.
    - ``on_error``: when Redis fails or times out, "raise" the error
      (default), or answer for it: "open" admits, "closed" denies. Such
      answers have ``degraded=True`` and are logged.
    - ``denial_cache``: a number of entries (or a ``DenialCache``) to answer
      known denials locally until their retry time; off by default.

    ``timeout`` and ``on_error`` can also be given per call.
    """

    def __init__(
        self,
        client: Union[Redis, RedisCluster],
        *,
        backend: Optional[BackendName] = None,
        timeout: Optional[float] = None,
        on_error: OnError = "raise",
        denial_cache: Union[int, DenialCache, None] = None,
    ) -> None:
        super().__init__(client, backend=backend, timeout=timeout, on_error=on_error, denial_cache=denial_cache)
        self._pool: Optional[concurrent.futures.ThreadPoolExecutor] = None
        self._pool_lock = threading.Lock()

    def consume(
        self,
        key: KeyT,
        bucket: Bucket,
        cost: float = 1,
        *,
        timeout: Optional[float] = None,
        on_error: Optional[OnError] = None,
    ) -> Decision:
        """Charges `cost` tokens if the bucket holds them (TB.CONSUME)."""
        return self._single("consume", key, bucket, cost, timeout, on_error)

    def peek(
        self,
        key: KeyT,
        bucket: Bucket,
        cost: float = 1,
        *,
        timeout: Optional[float] = None,
        on_error: Optional[OnError] = None,
    ) -> Decision:
        """What `consume` would answer, without charging (TB.PEEK)."""
        return self._single("peek", key, bucket, cost, timeout, on_error)

    def adjust(
        self,
        key: KeyT,
        bucket: Bucket,
        delta: float,
        *,
        timeout: Optional[float] = None,
        on_error: Optional[OnError] = None,
    ) -> Decision:
        """Refunds (delta > 0) or charges without asking (delta < 0, down
        to a debt of -max) (TB.ADJUST)."""
        return self._single("adjust", key, bucket, delta, timeout, on_error)

    def consume_many(
        self,
        groups: Iterable[GroupIn],
        *,
        atomic: Optional[bool] = None,
        timeout: Optional[float] = None,
        on_error: Optional[OnError] = None,
    ) -> MultiDecision:
        """Charges every `(key, bucket, cost)` or none (TB.MCONSUME).

        On a Redis Cluster with keys in several slots, one call can't reach
        them all, so by default (``atomic=None``) the buckets are charged
        one by one, refunded if a later one denies: the same answer, but
        not atomic. ``atomic=True`` raises CrossSlotError instead;
        ``atomic=False`` always goes bucket by bucket.
        """
        req = self._check_many(groups, atomic)
        cached = self._cached_many(req)
        if cached is not None:
            return cached
        return self._run(self._plan_many(req), timeout, on_error, describe(req), lambda a: self._degraded_many(req, a))

    def detect(self, probe_key: KeyT = PROBE_KEY, *, timeout: Optional[float] = None) -> str:
        """Finds the backend now with a read-only TB.PEEK of `probe_key`
        (readiness checks); raises if Redis can't serve any."""
        return self._run(self._plan_detect(probe_key), timeout, "raise", "detect", _never)

    def _single(
        self, op: Any, key: KeyT, bucket: Bucket, amount: Any, timeout: Optional[float], on_error: Optional[OnError]
    ) -> Decision:
        req = self._check_one(op, key, bucket, amount)
        cached = self._cached_one(req)
        if cached is not None:
            return cached
        return self._run(self._plan_one(req), timeout, on_error, describe(req), lambda a: self._degraded_one(req, a))

    def _run(
        self,
        plan: Plan[T],
        timeout: Optional[float],
        on_error: Optional[OnError],
        what: str,
        degraded: Callable[[bool], T],
    ) -> T:
        timeout, policy = self._options(timeout, on_error)
        try:
            if timeout is None:
                return drive(plan, self._execute)
            future = self._helper().submit(drive, plan, self._execute)
            try:
                return future.result(timeout)
            except concurrent.futures.TimeoutError:
                future.cancel()
                raise TimeoutError(f"no answer from Redis within {timeout} s") from None
        except Exception as exc:
            return self._failed(exc, policy, what, degraded)

    def _helper(self) -> concurrent.futures.ThreadPoolExecutor:
        with self._pool_lock:
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(8, thread_name_prefix="redis-tokenbucket")
            return self._pool


def _never(allowed: bool) -> str:
    raise AssertionError("detect() always raises")
