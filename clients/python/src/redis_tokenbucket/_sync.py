"""The blocking Limiter, over redis.Redis or redis.cluster.RedisCluster."""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable, Iterable
from typing import Any, Optional, TypeVar, Union, cast

from redis import Redis
from redis.cluster import RedisCluster

from ._bucket import Bucket, KeyT
from ._core import PROBE_KEY, Command, GroupIn, Job, LimiterBase, OnError, Plan
from ._decision import Decision, MultiDecision

T = TypeVar("T")
_POOL_LOCK = threading.Lock()


def drive(plan: Plan[T], execute: Callable[[Command], Any]) -> T:
    """Runs a plan with blocking calls."""
    try:
        command = next(plan)
        while True:
            try:
                reply = execute(command)
            except Exception as exc:  # the plan decides what an error means
                command = plan.throw(exc)
            else:
                command = plan.send(reply)
    except StopIteration as done:
        result: T = done.value
        return result


class Limiter(LimiterBase[Union[Redis, RedisCluster]]):
    """Token buckets in Redis, with blocking calls.

    ``Limiter(redis.Redis())`` or ``Limiter(redis.cluster.RedisCluster(...))``.

    - ``backend``: force "module", "functions" or "eval"; by default the
      first call finds it (TB.* commands, else the Functions library,
      loaded if missing, else the EVAL script), and again whenever a reply
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
        return self._run(self._job_one("consume", key, bucket, cost, timeout, on_error))

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
        return self._run(self._job_one("peek", key, bucket, cost, timeout, on_error))

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
        return self._run(self._job_one("adjust", key, bucket, delta, timeout, on_error))

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
        return self._run(self._job_many(groups, atomic, timeout, on_error))

    def reset(self, key: KeyT, *, timeout: Optional[float] = None) -> bool:
        """Deletes the bucket at `key` (DEL: whatever the key holds), so it
        is full again, and drops any denial the cache holds for it. True if
        there was a key to delete. Redis errors raise, whatever `on_error`."""
        return self._run(self._job_reset(key, timeout))

    def detect(self, probe_key: KeyT = PROBE_KEY, *, timeout: Optional[float] = None) -> str:
        """Finds the backend now with a read-only TB.PEEK of `probe_key`
        (readiness checks); raises if Redis can't serve any."""
        return self._run(self._job_detect(probe_key, timeout))

    def _run(self, job: Job[T]) -> T:
        if job.plan is None:
            return cast(T, job.done)  # answered without a round trip
        try:
            if job.timeout is None:
                return drive(job.plan, self._execute)
            # A blocking command can't be abandoned: run it on a helper
            # thread and stop waiting for it.
            future = self._helper().submit(drive, job.plan, self._execute)
            try:
                return future.result(job.timeout)
            except concurrent.futures.TimeoutError:
                future.cancel()
                raise TimeoutError(f"no answer from Redis within {job.timeout} s") from None
        except Exception as exc:
            return self._failed(exc, job)

    def _helper(self) -> concurrent.futures.ThreadPoolExecutor:
        with _POOL_LOCK:
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(8, thread_name_prefix="redis-tokenbucket")
            pool: concurrent.futures.ThreadPoolExecutor = self._pool
            return pool
