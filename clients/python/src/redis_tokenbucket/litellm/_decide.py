"""One decision per request, all or nothing, and its settling.

The decision: with no parallel limit, one `consume_many` of every bucket
(TB.MCONSUME). With parallel limits, their leases are taken in a fixed
order, and the last one carries every bucket in the same TB.ACQUIRE, so
the buckets are charged only if every slot was free; a lease denied gives
back the ones taken before it. A denial therefore charges nothing and
holds no slot. (On a Redis Cluster the keys of one request don't share a
slot: the leases come first, then the buckets in one `consume_many`, which
goes bucket by bucket with refunds there.)

The settling: the token reservation adjusted to what the call used (a
refund, or a charge into bounded debt), or refunded whole after a failure,
and every slot released; exactly once per request.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any, Optional, Union

from .._bucket import Bucket
from .._decision import Decision, MultiDecision
from .._hold import AsyncHold
from .._lease import Concurrency, Lease
from .._quota import Quota, Rule
from ..asyncio import Limiter
from ._limits import Limit

log = logging.getLogger("redis_tokenbucket.litellm")


@dataclass(frozen=True)
class Refusal:
    """A request the limits refuse: `status` 429 (a limit tripped, `limit`
    names it) or 503 (Redis failing under "closed", or this process too
    busy to get its answer), with the seconds to wait and the state of the
    limits that answered."""

    status: int
    retry_after: int  # whole seconds
    limit: Optional[Limit]
    answered: tuple[tuple[Limit, Union[Decision, Lease]], ...] = ()


@dataclass
class Reservation:
    """What an admitted request holds until it is settled."""

    holds: list[AsyncHold]
    tokens: list[tuple[Limit, int]]  # each token bucket and what it was charged
    requests: list[Limit]  # each request bucket (charged 1)
    answered: tuple[tuple[Limit, Union[Decision, Lease]], ...]
    degraded: bool = False
    # The prompt's tokens, to count a stream's usage when it reports none.
    prompt_tokens: int = 0
    model: str = ""
    # With max_delay, the wait before the call may go (a reservation).
    delay_ms: int = 0
    settled: bool = False
    watchdog: Optional[asyncio.TimerHandle] = field(default=None, repr=False)


async def decide(
    lim: Limiter, limits: list[Limit], reserve: int, lease_id: str, cluster: bool, max_wait: Optional[float] = None
) -> Union[Reservation, Refusal]:
    """Admits the request against every limit or none; `reserve` is the
    tokens charged to each token bucket (at most its whole minute) and
    each token budget (at most its whole period). With `max_wait`, buckets
    short of tokens within that many seconds reserve them (TB.CHARGE WAIT)
    and the Reservation's delay_ms is the wait; TB.ACQUIRE can't reserve,
    so the leases then go first, on their own, as on a Cluster."""
    groups: list[tuple[str, Rule, float]] = []
    tokens: list[tuple[Limit, int]] = []
    requests: list[Limit] = []
    by_key: dict[str, Limit] = {}
    slots: list[Limit] = []
    for limit in limits:
        by_key[limit.key] = limit
        if isinstance(limit.rule, Concurrency):
            slots.append(limit)
            continue
        cost = 1 if limit.kind == "requests" else min(reserve, limit.limit)
        groups.append((limit.key, limit.rule, cost))
        if limit.kind == "tokens":
            tokens.append((limit, cost))
        else:
            requests.append(limit)
    # Under "local", a degraded denial is the in-process limit's: a 429 like
    # Redis's; under "closed" it is Redis failing: a 503.
    local = lim.on_error == "local"
    taken: list[Lease] = []
    for i, slot in enumerate(slots):
        carries = groups if (i == len(slots) - 1 and not cluster and max_wait is None) else []
        assert isinstance(slot.rule, Concurrency)
        lease = await lim.acquire(slot.key, slot.rule, buckets=carries, id=lease_id)
        if not lease.acquired:
            await _give_back(lim, taken)
            return _refused_lease(slot, lease, by_key, local)
        taken.append(lease)
        if carries:
            groups = []
    answered: list[tuple[Limit, Union[Decision, Lease]]] = []
    for slot, lease in zip(slots, taken, strict=True):
        answered.append((slot, lease))
        answered += [(by_key[str(d.key)], d) for d in lease.decisions]
    degraded = any(lease.degraded for lease in taken)
    if groups:
        many = await lim.consume_many(groups, max_wait=max_wait)
        if not many.allowed:
            await _give_back(lim, taken)
            return _refused_many(many, by_key, answered, local)
        answered += [(by_key[str(d.key)], d) for d in many.decisions]
        degraded = degraded or many.degraded
        delay_ms = 0 if many.degraded else many.delay_ms
    else:
        delay_ms = 0
    holds = [lim.keep(lease) for lease in taken]
    for hold in holds:
        await hold.__aenter__()  # renewed in the background until settled
    return Reservation(holds, tokens, requests, tuple(answered), degraded, delay_ms=delay_ms)


async def _give_back(lim: Limiter, taken: list[Lease]) -> None:
    for lease in taken:
        try:
            await lim.release(lease)
        except Exception as exc:  # left to expire; the request is refused all the same
            log.warning("a lease on %r could not be given back (%s); it expires in %d ms", lease.key, exc,
                        lease.concurrency.lease_ms)  # fmt: skip


def _refused_lease(slot: Limit, lease: Lease, by_key: dict[str, Limit], local: bool) -> Refusal:
    answered: tuple[tuple[Limit, Union[Decision, Lease]], ...] = ((slot, lease),)
    answered += tuple((by_key[str(d.key)], d) for d in lease.decisions)
    if lease.shed or (lease.degraded and not local):
        return Refusal(503, max(lease.retry_after, 1), None)
    if lease.busy:
        return Refusal(429, lease.retry_after, slot, answered)
    denied = max(lease.denied_by, key=lambda d: d.retry_after_ms)
    return Refusal(429, lease.retry_after, by_key[str(denied.key)], answered)


def _refused_many(
    many: MultiDecision, by_key: dict[str, Limit], answered: list[tuple[Limit, Union[Decision, Lease]]], local: bool
) -> Refusal:
    if many.shed or (many.degraded and not local):
        return Refusal(503, max(many.retry_after, 1), None)
    denied = many.tightest
    got = tuple(answered) + tuple((by_key[str(d.key)], d) for d in many.decisions)
    return Refusal(429, many.retry_after, by_key[str(denied.key)], got)


async def settle(lim: Limiter, reservation: Reservation, used: Optional[int], *, ran: bool = True) -> None:
    """Ends a request once: every slot released, and each token bucket
    adjusted from what was reserved to `used` (None: the call failed, and
    the reservation is refunded whole). A request that never ran (`ran`
    False: cancelled while it waited its turn) has its request buckets
    refunded too. Errors are logged: the request's answer is already
    given."""
    if reservation.settled:
        return
    reservation.settled = True
    if reservation.watchdog is not None:
        reservation.watchdog.cancel()
    for hold in reservation.holds:
        await hold.__aexit__(None, None, None)  # a shielded release; failures are logged there
    refunds = [(limit, charged - (used if used is not None else 0)) for limit, charged in reservation.tokens]
    if not ran:
        refunds += [(limit, 1) for limit in reservation.requests]
    for limit, delta in refunds:
        if delta == 0:
            continue
        assert isinstance(limit.rule, (Bucket, Quota))
        try:
            await lim.adjust(limit.key, limit.rule, delta, on_error="open")
        except Exception as exc:
            log.warning("settling %s on %r by %+d tokens failed: %s", limit.name, limit.key, delta, exc)


def used_tokens(response: Any) -> Optional[int]:
    """The total tokens a response reports (its `usage`), else None."""
    usage = getattr(response, "usage", None)
    if usage is None and isinstance(response, dict):
        usage = response.get("usage")
    total = getattr(usage, "total_tokens", None)
    if total is None and isinstance(usage, dict):
        total = usage.get("total_tokens")
    return total if isinstance(total, int) and not isinstance(total, bool) and total >= 0 else None
