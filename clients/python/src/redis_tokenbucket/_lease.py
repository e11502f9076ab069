"""Concurrency leases: what a limit of streams in flight is (`Concurrency`),
what an acquire answers (`Lease`), and what `hold` raises when there is no
slot (`Busy`). Checked with the module's rules and messages
(contract/contract.json), as `Bucket` is."""

from __future__ import annotations

import numbers
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal, Optional

from ._bucket import InvalidArgument, check_name, invalid
from ._contract import MAX_LEASE_ID_BYTES, MAX_LEASE_LIMIT, MAX_LEASE_MS
from ._decision import Decision, _RetryAfter
from ._keys import KeyT, key_bytes

Held = Literal["redis", "local", "none"]
"""Where an acquired lease's slot is: in Redis, in this process's local
fallback (on_error="local"), or nowhere (denied, or admitted by
on_error="open" while Redis failed)."""


def check_int(value: Any, name: str, least: int, most: Optional[int] = None) -> int:
    """An integer argument (an int, not a bool or float) within bounds, with
    the module's messages."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise invalid(name, "not_an_integer", arg=name)
    number = int(value)
    if most is None:
        if number < least:
            raise invalid(name, "too_small", arg=name, least=least)
    elif not least <= number <= most:
        raise invalid(name, "int_out_of_range", arg=name, least=least, most=most)
    return number


@dataclass(frozen=True)
class Concurrency:
    """At most `limit` slots in flight per key, each lease living `lease_ms`
    without a renewal: ``Concurrency(limit=8, lease_ms=30_000, name="streams")``.

    Checked when built, with the module's rules and messages:
    `1 <= limit <= 1000000`, `1 <= lease_ms <= 86400000` (one day),
    integers. `name` names the policy in the RateLimit headers
    (`"streams";q=8;qu="concurrent-requests"`).
    """

    limit: int
    lease_ms: int
    name: Optional[str] = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "limit", check_int(self.limit, "limit", 1, MAX_LEASE_LIMIT))
        object.__setattr__(self, "lease_ms", check_int(self.lease_ms, "lease_ms", 1, MAX_LEASE_MS))
        if self.name is not None:
            check_name(self.name)

    def named(self, name: str) -> Concurrency:
        """The same limit under another policy name."""
        return Concurrency(self.limit, self.lease_ms, name)

    def check_weight(self, weight: Any) -> int:
        number = check_int(weight, "weight", 1)
        if number > self.limit:
            raise invalid("weight", "weight_above_limit")
        return number


def new_id() -> str:
    """A lease id no other holder will pick."""
    return str(uuid.uuid4())


def check_id(lease_id: Any, encoding: str) -> KeyT:
    """A caller's lease id: a str or bytes of 1 to 256 bytes as sent."""
    if isinstance(lease_id, (bytearray, memoryview)):
        lease_id = bytes(lease_id)
    if not isinstance(lease_id, (str, bytes)):
        raise TypeError(f"a lease id is a str or bytes, got {type(lease_id).__name__}")
    if not 1 <= len(key_bytes(lease_id, encoding)) <= MAX_LEASE_ID_BYTES:
        raise invalid("id", "bad_id")
    return lease_id


@dataclass(eq=False)
class Lease(_RetryAfter):
    """What `acquire` answers: TB.ACQUIRE's `[acquired, in_use,
    retry_after_ms, expires_in_ms, bucket replies...]` with the call that
    produced it.

    - `acquired`: the slot is taken (and every bucket charged), or nothing is;
    - `in_use`: the key's live weight after the call;
    - `retry_after_ms`: 0 when acquired; else the largest of the time until
      enough leases expire for this weight to fit and each bucket's wait (a
      release can free a slot sooner);
    - `expires_in_ms`: the lease's time to live (0 when denied);
    - `id`, `key`, `concurrency`, `weight`: what was asked;
    - `decisions`: one `Decision` per bucket, in order;
    - `degraded`, `shed`: as on a Decision (Redis failed and the policy
      answered; this process was too busy to get Redis's answer);
    - `lost`: set when a renewal found the lease gone (it expired, or was
      released): the slot is no longer this holder's.
    """

    acquired: bool
    in_use: int
    retry_after_ms: int
    expires_in_ms: int
    id: KeyT
    key: KeyT
    concurrency: Concurrency
    weight: int = 1
    decisions: tuple[Decision, ...] = ()
    degraded: bool = False
    shed: bool = False
    lost: bool = False
    held: Held = field(default="redis", repr=False)
    released: bool = field(default=False, repr=False)
    # The weight of this id's own live lease counted in `in_use`: a
    # re-acquire of a lease the limiter holds (a retry, a new weight).
    own_weight: int = field(default=0, repr=False)

    @property
    def busy(self) -> bool:
        """Denied for want of a slot (not only by a bucket): the other
        leases' live weight leaves no room for this one. On a re-acquire
        of a lease the limiter holds, its own weight in `in_use` is not
        counted twice."""
        return not self.acquired and self.in_use - self.own_weight + self.weight > self.concurrency.limit

    @property
    def remaining(self) -> int:
        """Slots (weight) still free after the call."""
        return max(self.concurrency.limit - self.in_use, 0)

    @property
    def denied_by(self) -> tuple[Decision, ...]:
        """The buckets that could not pay."""
        return tuple(d for d in self.decisions if not d.allowed)


class Busy(Exception):
    """Raised by `hold` when the lease was not acquired: no slot free, a
    bucket that could not pay, a shed call, or Redis failing under a policy
    that denies. `lease` is the denied Lease, with the reason."""

    def __init__(self, lease: Lease) -> None:
        self.lease = lease
        super().__init__(_why(lease))


def _why(lease: Lease) -> str:
    if lease.shed:
        return f"no lease on {lease.key!r}: this process was too busy to get Redis's answer in time"
    if lease.degraded:
        return f"no lease on {lease.key!r}: Redis failed and the policy denies"
    parts = []
    if lease.busy:
        parts.append(f"{lease.in_use} of {lease.concurrency.limit} slots in use")
    parts += [f"bucket {d.key!r} can't pay {d.cost:g}" for d in lease.denied_by]
    return f"no lease on {lease.key!r}: {', '.join(parts) or 'denied'}; retry in {lease.retry_after_ms} ms"


__all__ = ["Busy", "Concurrency", "InvalidArgument", "Lease", "check_id", "check_int", "new_id"]
