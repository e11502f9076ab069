"""The asyncio Limiter, over redis.asyncio.Redis or redis.asyncio.RedisCluster.

The same API as ``redis_tokenbucket.Limiter``, awaitable; both run the
same plans (``_core``), only the I/O differs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Any, Optional, TypeVar, Union, cast

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from ._bucket import Bucket, KeyT
from ._core import PROBE_KEY, Command, GroupIn, Job, LimiterBase, OnError, Plan
from ._decision import Decision, MultiDecision

__all__ = ["Limiter"]

T = TypeVar("T")


async def drive(plan: Plan[T], execute: Callable[[Command], Any]) -> T:
    """Runs a plan with awaited calls."""
    try:
        command = next(plan)
        while True:
            try:
                reply = await execute(command)
            except Exception as exc:  # the plan decides what an error means
                command = plan.throw(exc)
            else:
                command = plan.send(reply)
    except StopIteration as done:
        result: T = done.value
        return result


class Limiter(LimiterBase[Union[Redis, RedisCluster]]):
    """Token buckets in Redis, awaitable. See ``redis_tokenbucket.Limiter``
    for the options; here ``timeout`` cancels the pending command
    (``asyncio.wait_for``) and needs no helper thread."""

    async def consume(
        self,
        key: KeyT,
        bucket: Bucket,
        cost: float = 1,
        *,
        timeout: Optional[float] = None,
        on_error: Optional[OnError] = None,
    ) -> Decision:
        """Charges `cost` tokens if the bucket holds them (TB.CONSUME)."""
        return await self._run(self._job_one("consume", key, bucket, cost, timeout, on_error))

    async def peek(
        self,
        key: KeyT,
        bucket: Bucket,
        cost: float = 1,
        *,
        timeout: Optional[float] = None,
        on_error: Optional[OnError] = None,
    ) -> Decision:
        """What `consume` would answer, without charging (TB.PEEK)."""
        return await self._run(self._job_one("peek", key, bucket, cost, timeout, on_error))

    async def adjust(
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
        return await self._run(self._job_one("adjust", key, bucket, delta, timeout, on_error))

    async def consume_many(
        self,
        groups: Iterable[GroupIn],
        *,
        atomic: Optional[bool] = None,
        timeout: Optional[float] = None,
        on_error: Optional[OnError] = None,
    ) -> MultiDecision:
        """Charges every `(key, bucket, cost)` or none (TB.MCONSUME); see
        ``redis_tokenbucket.Limiter.consume_many`` for Cluster slots."""
        return await self._run(self._job_many(groups, atomic, timeout, on_error))

    async def reset(self, key: KeyT, *, timeout: Optional[float] = None) -> bool:
        """Deletes the bucket at `key` (DEL: whatever the key holds), so it
        is full again, and drops any denial the cache holds for it. True if
        there was a key to delete. Redis errors raise, whatever `on_error`."""
        return await self._run(self._job_reset(key, timeout))

    async def detect(self, probe_key: KeyT = PROBE_KEY, *, timeout: Optional[float] = None) -> str:
        """Finds the backend now with a read-only TB.PEEK of `probe_key`
        (readiness checks); raises if Redis can't serve any."""
        return await self._run(self._job_detect(probe_key, timeout))

    async def _run(self, job: Job[T]) -> T:
        if job.plan is None:
            return cast(T, job.done)  # answered without a round trip
        try:
            if job.timeout is None:
                return await drive(job.plan, self._execute)
            return await asyncio.wait_for(drive(job.plan, self._execute), job.timeout)
        except Exception as exc:
            return self._failed(exc, job)
