"""The blocking Limiter, over redis.Redis or redis.cluster.RedisCluster."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from types import TracebackType
from typing import Any, Optional, TypeVar, Union, cast

from redis import Redis
from redis.cluster import RedisCluster

from ._bucket import Bucket, KeyT
from ._commands import Command
from ._decision import Decision, MultiDecision
from ._engine import Plan
from ._hold import Hold
from ._lease import Concurrency, Lease
from ._limiter import LimiterBase
from ._penalty import check_block, penalized, penalty
from ._quota import Rule
from ._requests import PROBE_KEY, GroupIn, Job, OnError
from ._transport import SyncTransport

T = TypeVar("T")


def drive(plan: Plan[T], send: Callable[[Command, Optional[float]], Any], timeout: Optional[float]) -> T:
    """Runs a plan with blocking calls."""
    try:
        command = next(plan)
        while True:
            try:
                reply = send(command, timeout)
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
    - ``timeout``: seconds Redis has to answer a command, counted from
      when it is written (default 0.1). Over a ``redis.Redis`` the limiter
      keeps its own connections, made from the client's settings, whose
      socket timeout is this budget: no thread, no retries of redis-py's
      on top; waiting for one of them (a bounded pool) is bounded by it
      too, and running out of it sheds. Other clients (Cluster, ...) use
      their own timeouts. None: the client's own connections and timeouts.
    - ``on_error``: when Redis fails (refused, reset, no answer in time,
      LOADING, READONLY, ...), "raise" the error (default), or answer for
      it: "open" admits, "closed" denies, "local" answers from in-process
      buckets of ``max/processes`` and ``rate/processes`` (the ``local``
      extra). Such answers have ``degraded=True`` and are logged. Usage
      errors (bad arguments, WRONGTYPE, no permission) always raise.
      Local overload is never a Redis failure: the call is shed
      (``allowed=False, shed=True``) under every policy.
    - ``breaker``: the circuit breaker (``Breaker()``'s defaults: open
      after 5 failures in 10 s, probe after 2 s); False for none.
    - ``processes``: how many processes share each limit, for "local".
    - ``on_decision``: called with a ``DecisionEvent`` for each decision:
      its ``outcome`` and the ``rule`` that decided.
    - ``near_limit_ratio``: the share of a budget used from which an
      admission is "near_limit" in the events (0.8, envoyproxy/ratelimit's).
    - ``shadow``: dry-run: a bucket's denial of ``consume`` or
      ``consume_many`` is answered admitted with ``shadow=True``
      (``retry_after_ms`` 0), reported "shadow_mode" and logged (INFO).
      The denial wrote nothing, as an enforced one, so the shadow counts
      are what enforcement would deny. A shed or "closed" denial stands.
    - ``denial_cache``: a number of entries (or a ``DenialCache``) to answer
      known denials locally until their retry time; off by default.
    - ``wait_replicas``, ``wait_timeout``: ``WAIT wait_replicas
      wait_timeout`` (seconds, default 0.05) pipelined behind every
      consume, consume_many and acquire; fewer replicas behind an
      admission is a Redis failure (the ``on_error`` answer). 0 (the
      default) is off; refused on a Cluster client.

    ``timeout`` and ``on_error`` can also be given per call, and
    ``shadow`` per ``consume`` and ``consume_many``. ``close()``
    (or ``with``) closes the limiter's own connections, not the client.
    """

    _transport_class = SyncTransport
    _transport: SyncTransport
    # What `wait` sleeps with: replace it to pace on your own clock.
    sleep: Callable[[float], None] = staticmethod(time.sleep)

    def consume(
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
        `cost` of a Quota's period if it has them left (TB.QUOTA).

        `max_wait` (seconds, buckets only) reserves: a bucket that would
        hold the tokens within `max_wait` admits now, in debt, and the
        Decision's `delay_ms` is the wait before proceeding (TB.CONSUME
        ... WAIT max_ms); `wait()` sleeps it for you.

        `block` (seconds, buckets only) is a penalty: a denial charges the
        bucket into debt (TB.ADJUST) so that the caller is refused for
        `block` seconds (`_penalty`); at most `(max + cost) / rate`."""
        seconds = check_block(block, bucket, cost)
        options = self._options(timeout, on_error)
        d = self._run(self._requests.one("consume", key, bucket, cost, options, max_wait), shadow)
        charge = penalty(d, seconds) if seconds is not None else 0.0
        if charge <= 0 or seconds is None:
            return d
        # Failing open: Redis's denial stands whatever becomes of its penalty.
        adjusted = self.adjust(key, bucket, -charge, timeout=timeout, on_error="open")
        return penalized(d, adjusted, seconds)

    def peek(
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
        return self._run(self._requests.one("peek", key, bucket, cost, options, max_wait))

    def adjust(
        self,
        key: KeyT,
        bucket: Rule,
        delta: float,
        *,
        timeout: Optional[float] = None,
        on_error: Optional[OnError] = None,
    ) -> Decision:
        """Refunds (delta > 0) or charges without asking (delta < 0, down
        to a debt of -max) (TB.ADJUST); for a Quota, within its current
        period, down to -limit left (TB.QADJUST)."""
        return self._run(self._requests.one("adjust", key, bucket, delta, self._options(timeout, on_error)))

    def wait(
        self,
        key: KeyT,
        bucket: Bucket,
        cost: float = 1,
        *,
        max_wait: float,
        timeout: Optional[float] = None,
        on_error: Optional[OnError] = None,
    ) -> Decision:
        """Reserves `cost` tokens within `max_wait` seconds (`consume` with
        `max_wait`) and sleeps the reservation's `delay_ms` before
        returning its Decision. A denial (the tokens are further off than
        `max_wait`) returns at once: never a retry loop. Sleeps with
        `self.sleep` (time.sleep)."""
        d = self.consume(key, bucket, cost, max_wait=max_wait, timeout=timeout, on_error=on_error)
        if d.delay_ms > 0 and not d.degraded:
            self.sleep(d.delay_ms / 1000)
        return d

    def consume_many(
        self,
        groups: Iterable[GroupIn],
        *,
        atomic: Optional[bool] = None,
        max_wait: Optional[float] = None,
        timeout: Optional[float] = None,
        on_error: Optional[OnError] = None,
        shadow: Optional[bool] = None,
    ) -> MultiDecision:
        """Charges every `(key, rule, cost)` or none (TB.MCONSUME; TB.CHARGE
        when a rule is a Quota, or with `max_wait`, which reserves the
        buckets' tokens as `consume` does).

        On a Redis Cluster with keys in several slots, one call can't reach
        them all, so by default (``atomic=None``) the buckets are charged
        one by one, refunded if a later one denies: the same answer, but
        not atomic. ``atomic=True`` raises CrossSlotError instead;
        ``atomic=False`` always goes bucket by bucket.
        """
        return self._run(self._requests.many(groups, atomic, self._options(timeout, on_error), max_wait), shadow)

    def acquire(
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
        """Takes `weight` of the key's `concurrency.limit` slots for
        `concurrency.lease_ms`, charging every `(key, rule, cost)` of
        `buckets` (a Bucket or a Quota) in the same decision, all or
        nothing (TB.ACQUIRE). `id`
        names the lease (a new UUID by default); acquiring a live id again
        renews it. The Lease says whether it was acquired, and when to
        retry if not."""
        return self._run(
            self._requests.acquire(key, concurrency, weight, buckets, id, self._options(timeout, on_error))
        )

    def renew(self, lease: Lease, *, timeout: Optional[float] = None) -> bool:
        """Extends the lease to `lease_ms` from now (TB.RENEW). False, and
        `lease.lost` set, when it expired or was released: it is never
        taken again (acquire again instead). Redis errors raise."""
        return self._run(self._requests.renew(lease, self._options(timeout, "raise")))

    def release(self, lease: Lease, *, timeout: Optional[float] = None) -> bool:
        """Gives the slot back (TB.RELEASE): True if the lease was live;
        releasing again is harmless. Redis errors raise."""
        return self._run(self._requests.release(lease, self._options(timeout, "raise")))

    def in_flight(self, key: KeyT, *, timeout: Optional[float] = None) -> int:
        """The weight of the key's live leases (TB.INFLIGHT, read-only)."""
        return self._run(self._requests.inflight(key, self._options(timeout, "raise")))

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
    ) -> Hold:
        """``with lim.hold(key, concurrency) as lease:`` acquires a lease,
        raising `Busy` (with the denied Lease) if there is no slot; renews
        it on a daemon thread about every `lease_ms / 3` while the block
        runs (`lease.lost` is set if a renewal finds it gone); and releases
        it however the block ends. A release that fails is logged and the
        lease left to expire."""
        return Hold(self, lambda: self.acquire(key, concurrency, weight, buckets, id=id, timeout=timeout,
                                               on_error=on_error))  # fmt: skip

    def keep(self, lease: Lease) -> Hold:
        """``with lim.keep(lease):`` renews and releases a lease `acquire`
        returned, as `hold` does (`Busy` if it was not acquired)."""
        return Hold(self, None, lease)

    def reset(self, key: KeyT, *, timeout: Optional[float] = None) -> bool:
        """Deletes the bucket at `key` (DEL: whatever the key holds), so it
        is full again, and drops any denial the cache holds for it. True if
        there was a key to delete. Redis errors raise, whatever `on_error`."""
        return self._run(self._requests.reset(key, self._options(timeout, "raise")))

    def detect(self, probe_key: KeyT = PROBE_KEY, *, timeout: Optional[float] = None) -> str:
        """Finds the backend now with a read-only TB.PEEK of `probe_key`
        (readiness checks); raises if Redis can't serve any. On the Lua
        library it also reads maxmemory-policy once (CONFIG GET, where the
        ACL allows) and logs the module's warning where keys can be evicted."""
        return self._run(self._requests.detect(probe_key, self._options(timeout, "raise")))

    def close(self) -> None:
        """Closes the limiter's own connections (not the client, which is
        yours); later calls raise LimiterError."""
        self._transport.close()

    def __enter__(self) -> Limiter:
        return self

    def __exit__(
        self, kind: Optional[type[BaseException]], exc: Optional[BaseException], tb: Optional[TracebackType]
    ) -> None:
        self.close()

    def _run(self, job: Job[T], shadow: Optional[bool] = None) -> T:
        started = time.perf_counter()
        if job.plan is None:
            return self._settled(job, cast(T, job.done), started, shadow)  # answered without a round trip
        result = drive(self._policy.run(job), self._transport.send, self._budget(job))
        return self._settled(job, result, started, shadow)
