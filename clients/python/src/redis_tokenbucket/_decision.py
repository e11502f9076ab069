"""What a call answers."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Optional

from ._keys import KeyT
from ._quota import Rule


def whole_seconds(ms: int) -> int:
    """Milliseconds as whole seconds, rounded up: waiting that long is
    always enough."""
    return -(-ms // 1000)


class _RetryAfter:
    retry_after_ms: int

    @property
    def retry_after(self) -> int:
        """`retry_after_ms` in whole seconds, rounded up (HTTP Retry-After)."""
        return whole_seconds(self.retry_after_ms)


@dataclass(frozen=True)
class Decision(_RetryAfter):
    """One bucket's (or quota's) answer: TB.CONSUME's `[allowed, remaining,
    retry_after_ms, reset_after_ms]` with the call that produced it;
    `bucket` is the rule charged, a Bucket or a Quota.

    `degraded` marks an answer made up by the failure policy because Redis
    failed (`allowed` is then the policy's: open or closed with numbers 0,
    or the in-process bucket's for "local"). `shed` marks a refusal because
    this process was too busy to get Redis's answer in time (never
    admitted; `retry_after_ms` is a short back-off). `cached` marks a
    denial answered from the local denial cache without a round trip.
    `shadow` marks a denial let through by shadow mode (`consume(...,
    shadow=True)`, or a shadow limiter): admitted, `retry_after_ms` 0, the
    other numbers the bucket's.

    For `adjust`, `cost` holds the delta, and `allowed` and
    `retry_after_ms` are about the next request of cost 1 (or `max`, if
    smaller): whether it would pass now, else when it will.

    `retry_after_ms` is 0 whenever `allowed` is True, but for a
    reservation (`max_wait`): admitted, it is the wait before the caller
    may proceed, `delay_ms`.
    """

    allowed: bool
    remaining: int
    retry_after_ms: int
    reset_after_ms: int
    key: KeyT
    bucket: Rule
    cost: float
    degraded: bool = False
    cached: bool = False
    shed: bool = False
    shadow: bool = False

    @property
    def delay_ms(self) -> int:
        """An admitted reservation's wait before the caller may proceed;
        0 for every other call."""
        return self.retry_after_ms if self.allowed else 0

    @property
    def rule(self) -> Optional[str]:
        """The name of the rule that decided: this bucket's (or quota's)."""
        return self.bucket.name

    @property
    def wait_ms(self) -> int:
        """Until this bucket matters again: the retry time when it denies,
        else the time until it is full."""
        return self.reset_after_ms if self.allowed else self.retry_after_ms

    @classmethod
    def from_reply(cls, reply: Sequence[int], key: KeyT, bucket: Rule, cost: float) -> Decision:
        allowed, remaining, retry_ms, reset_ms = reply
        # What the generated __init__ does, in one step instead of one
        # object.__setattr__ per field: this runs on every call.
        d = object.__new__(cls)
        d.__dict__.update(
            allowed=bool(allowed),
            remaining=int(remaining),
            retry_after_ms=int(retry_ms),
            reset_after_ms=int(reset_ms),
            key=key,
            bucket=bucket,
            cost=cost,
            degraded=False,
            cached=False,
            shed=False,
            shadow=False,
        )
        return d

    @classmethod
    def from_adjust(cls, reply: Sequence[int], key: KeyT, bucket: Rule, delta: float) -> Decision:
        """TB.ADJUST's reply, whose `allowed` is always 1 and whose retry
        time is for a request of cost 1 (or `max`): admitted is what that
        request would be."""
        d = cls.from_reply(reply, key, bucket, delta)
        d.__dict__["allowed"] = d.retry_after_ms == 0
        return d


@dataclass(frozen=True)
class MultiDecision(_RetryAfter):
    """The answer of `consume_many`: all buckets charged, or none.

    `decisions` has one Decision per bucket, in call order; each says
    whether that bucket alone could pay. `retry_after_ms` is the largest of
    theirs. `atomic` is False when the buckets were charged one by one
    (keys in several Cluster slots): see `Limiter.consume_many`.
    """

    allowed: bool
    retry_after_ms: int
    decisions: tuple[Decision, ...]
    atomic: bool = True
    # The optional HTTP rules skipped for a request with no identity.
    skipped: tuple[str, ...] = ()
    degraded: bool = False
    cached: bool = False
    shed: bool = False
    # A denial let through by shadow mode (see Decision.shadow); each of
    # `decisions` still says whether its bucket could pay.
    shadow: bool = False

    @property
    def rule(self) -> Optional[str]:
        """The name of the rule that decided: the tightest bucket's (None
        without decisions)."""
        return self.tightest.bucket.name if self.decisions else None

    @property
    def delay_ms(self) -> int:
        """With `max_wait`, the wait before proceeding when admitted (the
        longest of the reservations); 0 otherwise."""
        return self.retry_after_ms if self.allowed else 0

    @property
    def denied_by(self) -> tuple[Decision, ...]:
        """The buckets that could not pay."""
        return tuple(d for d in self.decisions if not d.allowed)

    @property
    def tightest(self) -> Decision:
        """The most restrictive bucket: a denying one with the longest wait,
        else the one with the smallest share of its capacity left."""
        return max(
            self.decisions,
            key=lambda d: (not d.allowed, d.retry_after_ms, -d.remaining / d.bucket.max),
        )
