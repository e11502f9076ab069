"""Requests: every call's arguments checked before anything is sent (in
the module's order, with its messages), made into a Job, and the Job's
plan: the commands it sends (through the engine) and what it makes of
their replies, the denial cache's part and the leases held included. How
a Job runs, and what it answers when Redis can't, is _policy. The Node
package's twin is requests.ts.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any, Generic, Literal, Optional, TypeVar, Union

from redis.exceptions import ResponseError

from ._bucket import Bucket, InvalidArgument, KeyT, check_cost, check_delta, invalid
from ._cache import DenialCache
from ._commands import Once
from ._contract import MAX_GROUPS, MAX_WAIT_MS
from ._decision import Decision, MultiDecision
from ._engine import Engine, Plan
from ._errors import CrossSlotError
from ._keys import check_key, key_bytes
from ._lease import Concurrency, Held, Lease, check_id, new_id
from ._local import LocalBuckets
from ._quota import Quota, Rule, check_quota_cost
from ._scripts import Args, BucketOp, Group, Op

T = TypeVar("T")

OnError = Literal["raise", "open", "closed", "local"]
ON_ERROR: tuple[OnError, ...] = ("raise", "open", "closed", "local")
Options = tuple[Optional[float], OnError]
"""A call's timeout and failure policy, the limiter's defaults filled in."""

GroupIn = Union[tuple[KeyT, Rule], tuple[KeyT, Rule, float]]

# The probe `detect()` peeks at; under `rl:` like the usual buckets, so an
# ACL key pattern such as `~rl:*` covers it.
PROBE_KEY = "rl:probe"
_PROBE = Bucket(1, 1)


# Plain classes with __slots__, not dataclasses: they are built on every
# call, and the hot path is worth a few microseconds.


class OneRequest:
    """A call on one rule; `after` is what follows its arguments (`WAIT
    max_ms`, a reservation), empty for most."""

    __slots__ = ("after", "amount", "bucket", "key", "op")

    def __init__(self, op: BucketOp, key: KeyT, bucket: Rule, amount: float, after: Args = ()) -> None:
        self.op, self.key, self.bucket, self.amount, self.after = op, key, bucket, amount, after


class ManyRequest:
    __slots__ = ("after", "each", "groups")

    def __init__(self, groups: tuple[Group, ...], each: bool, after: Args = ()) -> None:
        self.groups = groups
        self.each = each  # bucket by bucket instead of one MCONSUME
        self.after = after


class LeaseRequest:
    """A lease operation: its key, the Concurrency it is under (None for
    inflight), the lease id and weight, the buckets of an acquire, and the
    arguments sent before them (`head`, see _scripts.LeaseHead)."""

    __slots__ = ("concurrency", "groups", "head", "id", "key", "op", "weight")

    def __init__(
        self,
        op: Op,
        key: KeyT,
        concurrency: Optional[Concurrency],
        lease_id: KeyT,
        weight: int,
        groups: Sequence[Group],
        head: Args,
    ) -> None:
        self.op, self.key, self.concurrency, self.id, self.weight = op, key, concurrency, lease_id, weight
        self.groups = tuple(groups)
        self.head = head


class Job(Generic[T]):
    """One call, ready to run: its plan, or `done`, its answer when it needs
    no round trip (a cached denial); its timeout and failure policy; and the
    request (for the answers without Redis, a log line and the decision
    event). `source` names who answered when it was not the
    backend: "local" (the in-process buckets) or "" (the policy, a shed)."""

    __slots__ = ("done", "on_error", "plan", "req", "source", "timeout")

    def __init__(
        self,
        plan: Optional[Plan[T]],
        done: Optional[T],
        req: Union[OneRequest, ManyRequest, LeaseRequest, str],
        options: Options,
    ) -> None:
        self.plan, self.done, self.req = plan, done, req
        self.timeout, self.on_error = options
        self.source: Optional[str] = None

    @property
    def what(self) -> str:
        return describe(self.req)


class Requests:
    """The limiter's requests: checked, made into Jobs, and their plans on
    the engine. Owned by the limiter (_limiter), with the denial cache and
    the leases it holds."""

    def __init__(
        self,
        client: Any,
        engine: Engine,
        cluster: bool,
        encoding: str,
        denial_cache: Optional[DenialCache],
        local: Callable[[], LocalBuckets],
    ) -> None:
        self.client = client  # for a Cluster's hash slots
        self.engine = engine
        self._cluster = cluster
        self._encoding = encoding
        self.denial_cache = denial_cache
        # The in-process buckets (the policy's), for leases they hold.
        self._local = local
        # The leases this limiter holds, as (key, id) in the bytes Redis
        # sees, with their weight: a retried acquire of a held id counts
        # once, and its Lease knows its own weight is in `in_use`.
        self.held: dict[tuple[bytes, bytes], int] = {}

    # ---- requests: checked before anything is sent -----------------------

    def _check_one(self, op: BucketOp, key: KeyT, bucket: Rule, amount: Any, max_wait: Optional[float]) -> OneRequest:
        key = check_key(key)
        check_rule(bucket)
        value = check_delta(amount) if op == "adjust" else check_amount(amount, bucket)
        after = reservation(max_wait, (bucket,))
        return OneRequest(op, key, bucket, value, after)

    def _check_many(
        self, groups: Iterable[GroupIn], atomic: Optional[bool], max_wait: Optional[float] = None
    ) -> ManyRequest:
        # The module's order: the group count, each group left to right,
        # then duplicate keys; the first error wins.
        given = list(groups)
        if not given:
            raise InvalidArgument("groups", "consume_many needs at least one (key, bucket, cost)")
        checked = check_groups(given)
        self._check_duplicates(checked)
        split = self._cluster and len(checked) > 1 and len({self._slot(k) for k, _, _ in checked}) > 1
        if split and atomic:
            slots = ", ".join(f"{k!r}: {self._slot(k)}" for k, _, _ in checked)
            raise CrossSlotError(
                f"atomic consume_many needs every key in one Cluster hash slot, got {slots}; "
                "put the shared part in a hash tag (redis_tokenbucket.hash_tagged) or pass atomic=None"
            )
        after = reservation(max_wait, [r for _, r, _ in checked], many=True)
        return ManyRequest(tuple(checked), each=split or atomic is False, after=after)

    def _check_duplicates(self, groups: Sequence[Group], lease_key: Optional[KeyT] = None) -> None:
        """The module's last checks: a bucket on the lease key, then a key
        in two groups."""
        if lease_key is not None:
            raw = key_bytes(lease_key, self._encoding)
            for i, (key, _, _) in enumerate(groups, 1):
                if key_bytes(key, self._encoding) == raw:
                    raise invalid("buckets", "bucket_is_lease_key", group=i)
        seen: dict[bytes, int] = {}
        for i, (key, _, _) in enumerate(groups, 1):
            raw = key_bytes(key, self._encoding)
            if raw in seen:
                raise invalid("key", "duplicate_key", group=i, first=seen[raw])
            seen[raw] = i

    def _check_acquire(
        self, key: KeyT, concurrency: Concurrency, weight: Any, buckets: Iterable[GroupIn], lease_id: Any
    ) -> LeaseRequest:
        # The module's order: the id, the weight, the rules (their count,
        # each left to right), a rule on the lease key, duplicates.
        key = check_key(key)
        if not isinstance(concurrency, Concurrency):
            raise TypeError(f"expected a Concurrency, got {type(concurrency).__name__}")
        lease_id = new_id() if lease_id is None else check_id(lease_id, self._encoding)
        weight = concurrency.check_weight(weight)
        groups = check_groups(list(buckets))
        self._check_duplicates(groups, key)
        if self._cluster and groups and len({self._slot(k) for k in (key, *(k for k, _, _ in groups))}) > 1:
            slots = ", ".join(f"{k!r}: {self._slot(k)}" for k in (key, *(k for k, _, _ in groups)))
            raise CrossSlotError(
                f"acquire needs the lease key and its rules' keys in one Cluster hash slot, got {slots}; "
                "put the shared part in a hash tag (redis_tokenbucket.hash_tagged)"
            )
        head = (str(concurrency.limit), str(concurrency.lease_ms), lease_id, str(weight))
        return LeaseRequest("acquire", key, concurrency, lease_id, weight, groups, head)

    def _slot(self, key: KeyT) -> int:
        slot: int = self.client.keyslot(key)
        return slot

    # ---- jobs: what the public methods run --------------------------------

    def one(
        self, op: BucketOp, key: KeyT, bucket: Rule, amount: Any, options: Options, max_wait: Optional[float] = None
    ) -> Job[Decision]:
        req = self._check_one(op, key, bucket, amount, max_wait)
        if self.denial_cache is not None and not req.after:
            cached = self._cached_one(req)
            if cached is not None:
                return Job(None, cached, req, options)
        return Job(self._plan_one(req), None, req, options)

    def many(
        self, groups: Iterable[GroupIn], atomic: Optional[bool], options: Options, max_wait: Optional[float] = None
    ) -> Job[MultiDecision]:
        req = self._check_many(groups, atomic, max_wait)
        cached = self._cached_many(req)
        if cached is not None:
            return Job(None, cached, req, options)
        return Job(self._plan_many(req), None, req, options)

    def detect(self, probe_key: KeyT, options: Options) -> Job[str]:
        return Job(self._plan_detect(probe_key), None, "detect", options)

    def reset(self, key: KeyT, options: Options) -> Job[bool]:
        return Job(self._plan_reset(check_key(key)), None, "reset", options)

    def acquire(
        self,
        key: KeyT,
        concurrency: Concurrency,
        weight: Any,
        buckets: Iterable[GroupIn],
        lease_id: Any,
        options: Options,
    ) -> Job[Lease]:
        req = self._check_acquire(key, concurrency, weight, buckets, lease_id)
        return Job(self._plan_acquire(req), None, req, options)

    def inflight(self, key: KeyT, options: Options) -> Job[int]:
        req = LeaseRequest("inflight", check_key(key), None, "", 1, (), ())
        return Job(self._plan_inflight(req), None, req, options)

    def renew(self, lease: Lease, options: Options) -> Job[bool]:
        req = lease_request("renew", lease)
        if lease.held != "redis" or not lease.acquired:
            return Job(None, self._off_redis(req, lease), req, options)
        return Job(self._plan_renew(req, lease), None, req, options)

    def release(self, lease: Lease, options: Options) -> Job[bool]:
        req = lease_request("release", lease)
        if lease.acquired:
            # Given back now, whatever the answer: a release Redis can't
            # take leaves the lease to expire, and its holder holds it no more.
            self.held.pop(self._lease_ident(req), None)
        if lease.held != "redis" or not lease.acquired:
            return Job(None, self._off_redis(req, lease), req, options)
        return Job(self._plan_release(req, lease), None, req, options)

    def took(self, req: LeaseRequest, lease: Lease) -> None:
        """An acquire's answer: a lease it took is held."""
        if req.op == "acquire" and lease.acquired:
            self.held[self._lease_ident(req)] = req.weight

    def _off_redis(self, req: LeaseRequest, lease: Lease) -> bool:
        """Renewing or releasing a lease that holds no slot in Redis: a
        denied one (nothing to do), one admitted by on_error="open" (no
        slot anywhere: renewing keeps it, releasing ends it), or one of the
        in-process fallback (on_error="local"), which answers for it."""
        if not lease.acquired:
            return False
        if lease.held == "local":
            reply = self._local().run_lease(req.op, req.key, req.head, ())
            if req.op == "renew":
                return self._renewed(req, lease, bool(reply[0]), int(reply[1]))
            lease.released = True
            return bool(reply[0])
        if req.op == "renew":
            if lease.released:
                lease.lost = True  # one meaning for `lost`, in Redis or not
                return False
            return True
        released = not lease.released
        lease.released = True
        return released

    # ---- plans -----------------------------------------------------------

    def _cached_one(self, req: OneRequest) -> Optional[Decision]:
        if self.denial_cache is None or req.op == "adjust":
            return None
        return self.denial_cache.lookup_one(req.key, req.bucket, req.amount)

    def _cached_many(self, req: ManyRequest) -> Optional[MultiDecision]:
        if self.denial_cache is None or req.after:
            return None
        keys = tuple(k for k, _, _ in req.groups)
        hit = self.denial_cache.lookup(keys, [b for _, b, _ in req.groups], [c for _, _, c in req.groups])
        if hit is None:
            return None
        return MultiDecision(False, hit.retry_after_ms, hit.decisions, atomic=not req.each, cached=True)

    def _plan_one(self, req: OneRequest) -> Plan[Decision]:
        # A reservation is kept out of the denial cache: a plain denial says
        # nothing of it, nor its denial of a plain call.
        cache = self.denial_cache if not req.after else None
        # Before anything is sent: a denial's deadline counts from here.
        ticket = cache.sent(req.op, (req.key,)) if cache is not None else None
        try:
            reply = yield from self.engine.call(req.op, ((req.key, req.bucket, req.amount),), None, req.after)
        except BaseException:
            if ticket is not None:
                ticket.failed()
            raise
        make = Decision.from_adjust if req.op == "adjust" else Decision.from_reply
        decision = make(reply, req.key, req.bucket, req.amount)
        if ticket is not None:
            ticket.answered(decision.allowed, decision.retry_after_ms, (decision,))
        return decision

    def _plan_many(self, req: ManyRequest) -> Plan[MultiDecision]:
        cache = self.denial_cache if not req.after else None
        keys = [k for k, _, _ in req.groups]
        ticket = cache.sent("each" if req.each else "mconsume", keys) if cache is not None else None
        try:
            if req.each:
                result = yield from self._plan_each(req.groups, req.after)
            else:
                try:
                    allowed, retry_ms, *replies = yield from self.engine.call("mconsume", req.groups, None, req.after)
                except Exception as exc:
                    if not migrating(exc):
                        raise
                    # A slot moving: nothing ran, and the keys are not all on
                    # one node until it has moved. Key by key meanwhile.
                    if ticket is not None:
                        ticket.op = "each"
                    result = yield from self._plan_each(req.groups, req.after)
                else:
                    decisions = tuple(Decision.from_reply(r, *g) for r, g in zip(replies, req.groups, strict=True))
                    result = MultiDecision(bool(allowed), int(retry_ms), decisions)
        except BaseException:
            if ticket is not None:
                ticket.failed()
            raise
        if ticket is not None:
            ticket.answered(result.allowed, result.retry_after_ms, result.decisions)
        return result

    def _plan_each(self, groups: Sequence[Group], after: Args = ()) -> Plan[MultiDecision]:
        """All-or-nothing without TB.MCONSUME, for keys in several Cluster
        slots: charge bucket by bucket in order; when one denies, refund
        those already charged and peek at the rest, so the answer is the
        one TB.MCONSUME would give. Not atomic: until the refunds land,
        the refunded tokens are missing and a concurrent request can be
        denied for it; and if Redis fails between the charge and the
        refund, the charge stays."""
        charged: list[Decision] = []
        for i, (key, bucket, cost) in enumerate(groups):
            # A wait reserves bucket tokens; a quota never waits.
            wait = after if bucket.kind == "bucket" else ()
            reply = yield from self.engine.call("consume", ((key, bucket, cost),), None, wait)
            decision = Decision.from_reply(reply, key, bucket, cost)
            if decision.allowed:
                charged.append(decision)
                continue
            refunded = yield from self._refund(charged)
            rest = []
            for key, bucket, cost in groups[i + 1 :]:
                reply = yield from self.engine.call("peek", ((key, bucket, cost),))
                rest.append(Decision.from_reply(reply, key, bucket, cost))
            decisions = (*refunded, decision, *rest)
            return MultiDecision(False, max(d.retry_after_ms for d in decisions), decisions, atomic=False)
        return MultiDecision(True, max(d.retry_after_ms for d in charged), tuple(charged), atomic=False)

    def _refund(self, charged: Sequence[Decision]) -> Plan[list[Decision]]:
        """Gives back what a decision key by key charged before a later key
        denied: each charge refunded (TB.ADJUST, or TB.QADJUST for a quota),
        its decision what the all-or-nothing call would report."""
        refunded = []
        for c in charged:
            if c.cost > 0:
                reply = yield from self.engine.call("adjust", ((c.key, c.bucket, c.cost),))
                # It could pay on its own, as TB.MCONSUME would report it;
                # ADJUST's retry time (for cost 1) means nothing here.
                c = replace(Decision.from_reply(reply, c.key, c.bucket, c.cost), retry_after_ms=0)
            refunded.append(c)
        return refunded

    def _plan_reset(self, key: KeyT) -> Plan[bool]:
        cache = self.denial_cache
        ticket = cache.sent("reset", (key,)) if cache is not None else None
        try:
            # No key is a full bucket. A cluster client routes DEL by its key.
            # Once: a DEL run twice could wipe charges made in between.
            deleted = yield Once(("DEL", key))
        except BaseException:
            if ticket is not None:
                ticket.failed()
            raise
        if ticket is not None:
            ticket.answered(True, 0, ())
        return bool(deleted)

    def _plan_acquire(self, req: LeaseRequest) -> Plan[Lease]:
        cache = self.denial_cache
        # The buckets it charges: cached denials of them are forgotten. An
        # acquire's own denial is never cached (a release can free a slot
        # at any time).
        ticket = cache.sent("acquire", [k for k, _, _ in req.groups]) if cache is not None and req.groups else None
        # A re-acquire of a lease this limiter holds: its weight is in in_use.
        own = self.held.get(self._lease_ident(req), 0)
        try:
            try:
                reply = yield from self.engine.call("acquire", req.groups, (req.key, req.head))
            except Exception as exc:
                if not (req.groups and migrating(exc)):
                    raise
                lease = yield from self._plan_acquire_each(req)
            else:
                lease = lease_from_reply(reply, req, degraded=False)
        except BaseException:
            if ticket is not None:
                ticket.failed()
            raise
        lease.own_weight = own
        if ticket is not None:
            ticket.answered(lease.acquired, lease.retry_after_ms, lease.decisions)
        return lease

    def _plan_acquire_each(self, req: LeaseRequest) -> Plan[Lease]:
        """An acquire whose rules are in a slot that is moving: the rules
        charged key by key (all or none, as `_plan_each`), then the lease
        alone, whose being busy gives the rules back. The
        answer TB.ACQUIRE would give, but not atomic: a call in between may
        see the buckets charged for a lease that does not come."""
        many = yield from self._plan_each(req.groups)
        alone = LeaseRequest(req.op, req.key, req.concurrency, req.id, req.weight, (), req.head)
        if not many.allowed:
            # Denied by a bucket: no lease taken; in_use as the key has it.
            in_use = yield from self.engine.call("inflight", (), (req.key, ()))
            assert req.concurrency is not None
            return Lease(
                False, int(in_use), many.retry_after_ms, 0, req.id, req.key, req.concurrency, req.weight,
                many.decisions, held="none",
            )  # fmt: skip
        lease = lease_from_reply((yield from self.engine.call("acquire", (), (req.key, req.head))), alone, False)
        # Busy: the rules are given back, and could pay, as TB.ACQUIRE reports them.
        lease.decisions = tuple(many.decisions if lease.acquired else (yield from self._refund(many.decisions)))
        return lease

    def _plan_renew(self, req: LeaseRequest, lease: Lease) -> Plan[bool]:
        renewed, expires_ms = yield from self.engine.call("renew", (), (req.key, req.head))
        return self._renewed(req, lease, bool(renewed), int(expires_ms))

    def _renewed(self, req: LeaseRequest, lease: Lease, renewed: bool, expires_ms: int) -> bool:
        if renewed:
            lease.expires_in_ms = expires_ms
        else:
            lease.lost = True  # expired, or released by another: no longer held
            self.held.pop(self._lease_ident(req), None)
        return renewed

    def _plan_release(self, req: LeaseRequest, lease: Lease) -> Plan[bool]:
        released, _ = yield from self.engine.call("release", (), (req.key, req.head))
        lease.released = True
        return bool(released)

    def _plan_inflight(self, req: LeaseRequest) -> Plan[int]:
        in_use = yield from self.engine.call("inflight", (), (req.key, ()))
        return int(in_use)

    def _plan_detect(self, probe_key: KeyT) -> Plan[str]:
        yield from self.engine.call("peek", ((probe_key, _PROBE, 1.0),))
        # The Lua library can't say that the server may evict its keys, as
        # the module does: the readiness probe looks, once.
        if self.engine.backend in ("functions", "eval") and not self.engine.memory_checked:
            yield from self.engine.check_memory()
        return self.engine.backend or ""

    def _lease_ident(self, req: LeaseRequest) -> tuple[bytes, bytes]:
        return key_bytes(req.key, self._encoding), key_bytes(req.id, self._encoding)


def lease_from_reply(reply: Sequence[Any], req: LeaseRequest, degraded: bool) -> Lease:
    acquired, in_use, retry_ms, expires_ms, *replies = reply
    decisions = tuple(
        Decision(bool(a), int(r), int(w), int(t), k, b, c, degraded=degraded)
        for (a, r, w, t), (k, b, c) in zip(replies, req.groups, strict=True)
    )
    assert req.concurrency is not None
    held: Held = ("local" if degraded else "redis") if acquired else "none"
    return Lease(
        bool(acquired), int(in_use), int(retry_ms), int(expires_ms), req.id, req.key, req.concurrency,
        req.weight, decisions, degraded=degraded, held=held,
    )  # fmt: skip


def migrating(exc: BaseException) -> bool:
    """A multi-key call refused because its slot is moving (TRYAGAIN, or
    ASK, before anything ran), directly or after redis-py's Cluster client
    retried it until its TTL ran out."""
    name = type(exc).__name__
    if name in ("TryAgainError", "AskError"):
        return True
    if name == "ClusterError":
        return "TTL exhausted" in str(exc)
    return isinstance(exc, ResponseError) and str(exc).startswith(("TRYAGAIN", "ASK "))


def check_groups(given: list[Any]) -> list[Group]:
    """Rules given as (key, rule) or (key, rule, cost), checked in the
    module's order: their count, then each left to right."""
    if len(given) > MAX_GROUPS:
        raise invalid("groups", "too_many_groups")
    checked: list[Group] = []
    for i, group in enumerate(given, 1):
        key, bucket, *cost = group
        key = check_key(key, i)
        check_rule(bucket, i)
        if len(cost) > 1:
            raise ValueError(f"group {i}: expected (key, bucket) or (key, bucket, cost)")
        checked.append((key, bucket, check_amount(cost[0] if cost else 1, bucket, i)))
    return checked


def lease_request(op: Op, lease: Lease) -> LeaseRequest:
    if not isinstance(lease, Lease):
        raise TypeError(f"expected a Lease (what acquire returns), got {type(lease).__name__}")
    head: Args = (lease.id, str(lease.concurrency.lease_ms)) if op == "renew" else (lease.id,)
    return LeaseRequest(op, lease.key, lease.concurrency, lease.id, lease.weight, (), head)


def check_rule(rule: Any, group: Optional[int] = None) -> None:
    if not isinstance(rule, (Bucket, Quota)):
        where = "" if group is None else f" (group {group})"
        raise TypeError(f"expected a Bucket or a Quota{where}, got {type(rule).__name__}")


def check_amount(cost: Any, rule: Rule, group: Optional[int] = None) -> float:
    """A cost for a bucket or a quota, with the module's checks for each."""
    if isinstance(rule, Quota):
        return check_quota_cost(cost, rule, group)
    return check_cost(cost, rule, group)


# The longest wait, in seconds: the module's max_ms.
MAX_WAIT = MAX_WAIT_MS / 1000


def reservation(max_wait: Any, rules: Sequence[Rule], many: bool = False) -> Args:
    """`WAIT max_ms` for a wait of `max_wait` seconds (floored to the ms:
    never longer than asked), or nothing for None. Only buckets reserve:
    a quota alone with a wait is an error, where TB.CHARGE waits for the
    buckets beside it."""
    if max_wait is None:
        return ()
    number = isinstance(max_wait, (int, float)) and not isinstance(max_wait, bool)
    if not (number and 0 <= max_wait <= MAX_WAIT):
        raise InvalidArgument("max_wait", f"max_wait must be >= 0 and <= {MAX_WAIT:g} seconds, or None")
    if not many and all(r.kind == "quota" for r in rules):
        raise InvalidArgument("max_wait", "max_wait is for buckets: a quota never reserves, it resets")
    # Rounded to the µs first: 1.001 s is 1001 ms, whatever the float.
    return ("WAIT", str(math.floor(round(max_wait * 1000, 3))))


def check_timeout(timeout: Optional[float]) -> Optional[float]:
    number = isinstance(timeout, (int, float)) and not isinstance(timeout, bool)
    if timeout is not None and not (number and 0 < timeout < 1e9):
        raise ValueError("timeout must be > 0 seconds (and finite), or None for the client's own timeouts")
    return None if timeout is None else float(timeout)


def check_on_error(on_error: str) -> OnError:
    for policy in ON_ERROR:
        if on_error == policy:
            return policy
    raise ValueError(f"on_error must be one of {', '.join(ON_ERROR)}, got {on_error!r}")


def describe(req: Union[OneRequest, ManyRequest, LeaseRequest, str]) -> str:
    """What a log line says the degraded call was about."""
    if isinstance(req, str):
        return req
    if isinstance(req, (OneRequest, LeaseRequest)):
        return f"{req.op} {req.key!r}"
    return "consume_many " + ", ".join(repr(k) for k, _, _ in req.groups)
