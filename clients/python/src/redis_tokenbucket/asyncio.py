"""The asyncio Limiter, over redis.asyncio.Redis or redis.asyncio.RedisCluster.

The same API as ``redis_tokenbucket.Limiter``, awaitable; both run the
same plans (``_requests``), only the I/O differs.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable
from types import TracebackType
from typing import Any, Optional, TypeVar, Union, cast

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from ._bucket import Bucket, KeyT
from ._commands import Command
from ._decision import Decision, MultiDecision
from ._engine import Plan
from ._hold import AsyncHold
from ._lease import Concurrency, Lease
from ._limiter import LimiterBase
from ._penalty import check_block, penalized, penalty
from ._quota import Rule
from ._requests import PROBE_KEY, GroupIn, Job, OnError
from ._transport import AsyncTransport

__all__ = ["Limiter"]

T = TypeVar("T")


async def drive(plan: Plan[T], send: Callable[[Command, Optional[float]], Any], timeout: Optional[float]) -> T:
    """Runs a plan with awaited calls."""
    try:
        command = next(plan)
        while True:
            try:
                reply = await send(command, timeout)
            except Exception as exc:  # the plan decides what an error means
                command = plan.throw(exc)
            else:
                command = plan.send(reply)
    except StopIteration as done:
        result: T = done.value
        return result


class Limiter(LimiterBase[Union[Redis, RedisCluster]]):
    """Token buckets in Redis, awaitable. See ``redis_tokenbucket.Limiter``
    for the options. Over a plain ``redis.asyncio.Redis`` the tasks' commands
    share the limiter's own connection, those of one event-loop iteration
    written together, and each command's budget runs from its write; on a
    client the limiter keeps no connections of (a Cluster, ...) a timer
    bounds the client's whole call. ``aclose()`` (or ``async with``) closes
    the limiter's own connections."""

    _transport_class = AsyncTransport
    _transport: AsyncTransport
    # What `wait` sleeps with: replace it to pace on your own clock.
    sleep: Callable[[float], Awaitable[None]] = staticmethod(asyncio.sleep)

    async def consume(
        self,
        key: KeyT,
        bucket: Rule,
        cost: float = 1,
        *,
        max_wait: Optional[float] = None,
        timeout: Optional[float] = None,
        on_error: Optional[OnError] = None,
        shadow: Optional[bool] = None,
        block: Optional[float] = None,
    ) -> Decision:
        """Charges `cost` tokens if the bucket holds them (TB.CONSUME), or
        of a Quota's period (TB.QUOTA); `max_wait` reserves, as in
        ``redis_tokenbucket.Limiter.consume``."""
        seconds = check_block(block, bucket, cost)
        options = self._options(timeout, on_error)
        d = await self._run(self._requests.one("consume", key, bucket, cost, options, max_wait), shadow)
        charge = penalty(d, seconds) if seconds is not None else 0.0
        if charge <= 0 or seconds is None:
            return d
        # Failing open: Redis's denial stands whatever becomes of its penalty.
        adjusted = await self.adjust(key, bucket, -charge, timeout=timeout, on_error="open")
        return penalized(d, adjusted, seconds)

    async def peek(
        self,
        key: KeyT,
        bucket: Rule,
        cost: float = 1,
        *,
        max_wait: Optional[float] = None,
        timeout: Optional[float] = None,
        on_error: Optional[OnError] = None,
    ) -> Decision:
        """What `consume` would answer, without charging (TB.PEEK, TB.QPEEK)."""
        options = self._options(timeout, on_error)
        return await self._run(self._requests.one("peek", key, bucket, cost, options, max_wait))

    async def adjust(
        self,
        key: KeyT,
        bucket: Rule,
        delta: float,
        *,
        timeout: Optional[float] = None,
        on_error: Optional[OnError] = None,
    ) -> Decision:
        """Refunds (delta > 0) or charges without asking (delta < 0, down
        to a debt of -max) (TB.ADJUST; TB.QADJUST for a Quota)."""
        return await self._run(self._requests.one("adjust", key, bucket, delta, self._options(timeout, on_error)))

    async def wait(
        self,
        key: KeyT,
        bucket: Bucket,
        cost: float = 1,
        *,
        max_wait: float,
        timeout: Optional[float] = None,
        on_error: Optional[OnError] = None,
    ) -> Decision:
        """Reserves `cost` tokens within `max_wait` seconds and awaits the
        reservation's `delay_ms` (with `self.sleep`, asyncio.sleep) before
        returning its Decision; a denial returns at once."""
        d = await self.consume(key, bucket, cost, max_wait=max_wait, timeout=timeout, on_error=on_error)
        if d.delay_ms > 0 and not d.degraded:
            await self.sleep(d.delay_ms / 1000)
        return d

    async def consume_many(
        self,
        groups: Iterable[GroupIn],
        *,
        atomic: Optional[bool] = None,
        max_wait: Optional[float] = None,
        timeout: Optional[float] = None,
        on_error: Optional[OnError] = None,
        shadow: Optional[bool] = None,
    ) -> MultiDecision:
        """Charges every `(key, rule, cost)` or none (TB.MCONSUME, or
        TB.CHARGE with a Quota or `max_wait`); see
        ``redis_tokenbucket.Limiter.consume_many`` for Cluster slots."""
        options = self._options(timeout, on_error)
        return await self._run(self._requests.many(groups, atomic, options, max_wait), shadow)

    async def acquire(
        self,
        key: KeyT,
        concurrency: Concurrency,
        weight: int = 1,
        buckets: Iterable[GroupIn] = (),
        *,
        id: Optional[KeyT] = None,
        timeout: Optional[float] = None,
        on_error: Optional[OnError] = None,
    ) -> Lease:
        """Takes `weight` of the key's slots, with `buckets` charged in the
        same decision (TB.ACQUIRE); see ``redis_tokenbucket.Limiter.acquire``."""
        return await self._run(
            self._requests.acquire(key, concurrency, weight, buckets, id, self._options(timeout, on_error))
        )

    async def renew(self, lease: Lease, *, timeout: Optional[float] = None) -> bool:
        """Extends the lease to `lease_ms` from now (TB.RENEW); False, and
        `lease.lost` set, when it is gone."""
        return await self._run(self._requests.renew(lease, self._options(timeout, "raise")))

    async def release(self, lease: Lease, *, timeout: Optional[float] = None) -> bool:
        """Gives the slot back (TB.RELEASE): True if the lease was live."""
        return await self._run(self._requests.release(lease, self._options(timeout, "raise")))

    async def in_flight(self, key: KeyT, *, timeout: Optional[float] = None) -> int:
        """The weight of the key's live leases (TB.INFLIGHT, read-only)."""
        return await self._run(self._requests.inflight(key, self._options(timeout, "raise")))

    def hold(
        self,
        key: KeyT,
        concurrency: Concurrency,
        weight: int = 1,
        buckets: Iterable[GroupIn] = (),
        *,
        id: Optional[KeyT] = None,
        timeout: Optional[float] = None,
        on_error: Optional[OnError] = None,
    ) -> AsyncHold:
        """``async with lim.hold(key, concurrency) as lease:`` acquires a
        lease (`Busy` if there is no slot), renews it in a task about every
        `lease_ms / 3` while the block runs, and releases it however the
        block ends, a cancellation included (the release is shielded)."""
        return AsyncHold(self, lambda: self.acquire(key, concurrency, weight, buckets, id=id, timeout=timeout,
                                                    on_error=on_error))  # fmt: skip

    def keep(self, lease: Lease) -> AsyncHold:
        """``async with lim.keep(lease):`` renews and releases a lease
        `acquire` returned, as `hold` does (`Busy` if it was not acquired)."""
        return AsyncHold(self, None, lease)

    async def reset(self, key: KeyT, *, timeout: Optional[float] = None) -> bool:
        """Deletes the bucket at `key` (DEL: whatever the key holds), so it
        is full again, and drops any denial the cache holds for it. True if
        there was a key to delete. Redis errors raise, whatever `on_error`."""
        return await self._run(self._requests.reset(key, self._options(timeout, "raise")))

    async def detect(self, probe_key: KeyT = PROBE_KEY, *, timeout: Optional[float] = None) -> str:
        """Finds the backend now with a read-only TB.PEEK of `probe_key`
        (readiness checks); raises if Redis can't serve any. On the Lua
        library it also reads maxmemory-policy once (CONFIG GET, where the
        ACL allows) and logs the module's warning where keys can be evicted."""
        return await self._run(self._requests.detect(probe_key, self._options(timeout, "raise")))

    async def aclose(self) -> None:
        """Closes the limiter's own connections (not the client, which is
        yours); later calls raise LimiterError."""
        await self._transport.aclose()

    async def __aenter__(self) -> Limiter:
        return self

    async def __aexit__(
        self, kind: Optional[type[BaseException]], exc: Optional[BaseException], tb: Optional[TracebackType]
    ) -> None:
        await self.aclose()

    async def _run(self, job: Job[T], shadow: Optional[bool] = None) -> T:
        started = time.perf_counter()
        if job.plan is None:
            return self._settled(job, cast(T, job.done), started, shadow)  # answered without a round trip
        result = await drive(self._policy.run(job), self._transport.send, self._budget(job))
        return self._settled(job, result, started, shadow)
