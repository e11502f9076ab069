"""What the HTTP helpers share, whatever the framework (docs/failure-model.md,
HTTP answers), written once: the rules (a bucket, or a slot held until the
response is sent, per identity) and what they charge a request, the
leases a request holds until its last byte, the answer to a refused
request, the client's address behind trusted proxies, and the fields of
stacked limiters merged.

    admitted                 the route's status, RateLimit and RateLimit-Policy
    denied by a bucket       429, the fields, Retry-After, a problem+json body
    shed (local overload)    503, Retry-After
    degraded, "closed"       503, Retry-After: 1
    degraded, "open"         the route's status, no fields
    degraded, "local"        the route's, or 429 with Retry-After from the local bucket

`fastapi` adapts it to Starlette and FastAPI (re-exporting `Rule` and
`ConcurrencyRule`). The Node package's twin is http.ts.
"""

from __future__ import annotations

import asyncio
import inspect
import ipaddress
import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Optional, Protocol, TypeVar, Union

from ._bucket import Bucket, check_name
from ._decision import MultiDecision
from ._hold import AsyncHold, background
from ._key_owners import claim
from ._lease import Concurrency, Lease, check_int
from ._penalty import check_block, penalized, penalty
from ._quota import Quota
from ._quota import Rule as BucketOrQuota
from ._requests import check_amount
from .asyncio import Limiter
from .headers import rate_limit_headers

log = logging.getLogger("redis_tokenbucket")

QUOTA_EXCEEDED = "https://iana.org/assignments/http-problem-types#quota-exceeded"
PROBLEM_JSON = "application/problem+json"

IPAddress = Union[ipaddress.IPv4Address, ipaddress.IPv6Address]
IPNetwork = Union[ipaddress.IPv4Network, ipaddress.IPv6Network]


@dataclass(frozen=True)
class Refusal:
    """A refused request's answer: its status, header fields and
    problem+json body."""

    status: int
    headers: dict[str, str]
    body: dict[str, Any]


def refusal_of(decision: Union[MultiDecision, Lease], *, legacy_headers: bool = False) -> Refusal:
    """The refusal for a denial. A bucket's (Redis's, or the in-process one
    of on_error="local"): a 429 with the RateLimit fields, Retry-After, and
    a problem+json body naming the policies that refused (the buckets that
    could not pay, and a Lease's Concurrency when no slot was free). A
    denial nothing counted, shed or Redis failing under "closed", has no
    wait to tell: a 503 with Retry-After (`unavailable`), never a 429 with
    "retry now"."""
    if not counted(decision):
        return unavailable(decision)
    violated = [d.bucket.name or "default" for d in decision.denied_by]
    if isinstance(decision, Lease) and (decision.busy or not violated):
        violated.insert(0, decision.concurrency.name or "default")
    body = {
        "type": QUOTA_EXCEEDED,
        "title": "Request cannot be satisfied as assigned quota has been exceeded",
        "status": 429,
        "detail": f"Rate limited by {', '.join(violated)}: retry in {decision.retry_after} s.",
        "violated-policies": violated,
    }
    headers = rate_limit_headers(decision, legacy=legacy_headers)
    # A degraded denial (on_error="local") has no RateLimit fields, but its wait.
    headers.setdefault("Retry-After", str(decision.retry_after))
    return Refusal(429, headers, body)


class Refused(Exception):
    """A request refused by its rules before anything is sent to Redis:
    `refusal` is the answer."""

    @property
    def refusal(self) -> Refusal:
        raise NotImplementedError


class MissingIdentity(Refused):
    """A rule found no identity for the request (its key function, and its
    `fallback`, returned None) and is not `optional`: the request is
    refused with a 400 (`refusal`), never let through unlimited. Raised
    before anything is sent to Redis."""

    def __init__(self, name: str) -> None:
        super().__init__(f"rule {name}: missing (its key function)")
        self.name = name

    @property
    def refusal(self) -> Refusal:
        body = {
            "type": "about:blank",
            "title": "Bad Request",
            "status": 400,
            "detail": f"The {self.name} key is missing.",
        }
        return Refusal(400, {}, body)


@dataclass(frozen=True)
class Deny:
    """A limit of zero (envoyproxy/ratelimit's `requests_per_unit: 0`): a
    Rule whose bucket is a Deny refuses every request it applies to, with a
    429, without calling Redis. No refill ever admits one, so Retry-After
    is `retry_after` seconds (an hour by default): "not soon", long enough
    to keep a client out of a retry loop, short enough for a rule lifted
    meanwhile to be noticed."""

    name: str
    retry_after: int = 3600

    def __post_init__(self) -> None:
        check_name(self.name)
        if isinstance(self.retry_after, bool) or not isinstance(self.retry_after, int) or self.retry_after < 1:
            raise ValueError(f"a Deny's retry_after is a whole number of seconds >= 1, got {self.retry_after!r}")


class AlwaysDenied(Refused):
    """A request a Deny rule refuses: a 429 with the rule's RateLimit
    fields (`q=0`, `r=0`), Retry-After and a problem+json body."""

    def __init__(self, deny: Deny) -> None:
        super().__init__(f"rule {deny.name}: denies every request")
        self.deny = deny

    @property
    def refusal(self) -> Refusal:
        name, retry = self.deny.name, self.deny.retry_after
        body = {
            "type": QUOTA_EXCEEDED,
            "title": "Request cannot be satisfied as assigned quota has been exceeded",
            "status": 429,
            "detail": f"Rate limited by {name}: retry in {retry} s.",
            "violated-policies": [name],
        }
        headers = {
            "RateLimit-Policy": f'"{name}";q=0',
            "RateLimit": f'"{name}";r=0;t={retry}',
            "Retry-After": str(retry),
        }
        return Refusal(429, headers, body)


async def identity_of(rule: Any, request: Any, name: Callable[[], Awaitable[str]]) -> Optional[str]:
    """A rule's identity for the request: its key function's, else its
    fallback's; None when both miss and the rule is optional (skipped),
    MissingIdentity when it is not. `name` gives the policy's name."""
    identity = await of_request(rule.key, request)
    if identity is None and rule.fallback is not None:
        identity = await of_request(rule.fallback, request)
    # A shadow rule never refuses: one without an identity is skipped.
    if identity is None and not rule.optional and not getattr(rule, "shadow", False):
        raise MissingIdentity(await name())
    return None if identity is None else str(identity)


def counted(decision: Union[MultiDecision, Lease]) -> bool:
    """Whether a bucket (or a lease's slots) decided it: not shed, not the
    failure policy's answer (a degraded denial without a wait)."""
    return not (decision.shed or (decision.degraded and decision.retry_after_ms == 0))


def unavailable(decision: Union[MultiDecision, Lease, None] = None) -> Refusal:
    """The 503 of a fail-closed limiter whose Redis could not answer, or of
    a shed decision (this process too busy to get Redis's answer in time),
    with Retry-After."""
    shed = decision is not None and decision.shed
    body = {
        "type": "about:blank",
        "title": "Service Unavailable",
        "status": 503,
        "detail": "The server is overloaded." if shed else "The rate limiter is unavailable.",
    }
    retry = decision.retry_after if decision is not None and decision.retry_after > 0 else 1
    return Refusal(503, {"Retry-After": str(retry)}, body)


# ---- the client's address ---------------------------------------------------------


def trusted_networks(trusted_proxies: Iterable[Union[str, IPNetwork]]) -> tuple[IPNetwork, ...]:
    return tuple(ipaddress.ip_network(n, strict=False) if isinstance(n, str) else n for n in trusted_proxies)


def client_address(peer: str, forwarded_for: Sequence[str], trusted: Sequence[IPNetwork]) -> str:
    """The client's address: the socket `peer`, unless the peer is a
    trusted proxy, in which case X-Forwarded-For (each of its header lines,
    in order) is walked from the right to the first untrusted hop. A
    malformed hop ends the walk at the proxy that passed it on. IPv6
    clients count per /64; IPv4-mapped addresses count as IPv4."""
    addr = parse_ip(peer)
    if addr is None:
        return peer or "unknown"
    hops = ",".join(forwarded_for).split(",")
    for hop in reversed(hops):
        if not any(addr in net for net in trusted):
            break
        previous = parse_ip(hop)
        if previous is None:
            break
        addr = previous
    if isinstance(addr, ipaddress.IPv6Address):
        return str(ipaddress.IPv6Network((addr, 64), strict=False))
    return str(addr)


def parse_ip(text: str) -> Optional[IPAddress]:
    try:
        addr = ipaddress.ip_address(text.strip())
    except ValueError:
        return None
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped:
        return addr.ipv4_mapped
    return addr


# ---- fields of stacked limiters ---------------------------------------------------


class Fields(Protocol):
    """Header fields being chosen for a response: a dict, or a framework's
    mutable headers."""

    def get(self, key: str) -> Optional[str]: ...

    def __setitem__(self, key: str, value: str) -> None: ...


_LISTS = ("ratelimit", "ratelimit-policy")


def add_fields(chosen: Fields, fields: dict[str, str]) -> None:
    """Adds one limiter's fields to those others chose for the same
    response (stacked dependencies and middlewares): every policy that
    applied is in the RateLimit lists; of the legacy pair, the one with
    fewer left; of two waits, the longer."""
    for name, value in fields.items():
        current = chosen.get(name)
        key = name.lower()
        if not current:
            chosen[name] = value
        elif key in _LISTS:
            chosen[name] = f"{current}, {value}"
        elif key == "retry-after":
            chosen[name] = str(max(int(current), int(value)))
        elif key == "x-ratelimit-remaining":
            if int(value) < int(current):
                chosen[name] = value
                chosen["X-RateLimit-Limit"] = fields.get("X-RateLimit-Limit", chosen.get("X-RateLimit-Limit") or "")
        elif key != "x-ratelimit-limit":  # goes with its remaining, above
            chosen[name] = value


# ---- rules: what a request is charged, and the slots it holds ------------------------

# The framework's request: a rule only hands it to its functions.
RequestT = TypeVar("RequestT")

KeyFunc = Callable[[RequestT], Union[Optional[str], Awaitable[Optional[str]]]]
"""The request's identity for one rule, or None when it has none (the
rule's `fallback` is asked next; then the request is refused with a 400,
unless the rule is `optional`)."""

BucketFunc = Callable[[RequestT], Union[BucketOrQuota, Awaitable[BucketOrQuota]]]
"""The bucket (or quota) for this request (the caller's tier, say)."""

SkipFunc = Callable[[RequestT], Union[bool, Awaitable[bool]]]
"""True for a trusted caller: the rule is skipped, before anything is sent."""

ConcurrencyFunc = Callable[[RequestT], Union[Concurrency, Awaitable[Concurrency]]]
"""The Concurrency for this request (the caller's tier, say)."""


@dataclass(frozen=True)
class Rule:
    """One bucket per identity: requests are charged `cost` against the
    bucket at `prefix:name:identity`, the identity being what `key`
    returns. The bucket's name names the policy in the headers and in
    `violated-policies`.

    A request with no identity (`key` returns None) is asked `fallback`
    (another key function: `client_ip()`, say); with neither, it is
    refused with a 400, so that leaving out a header never escapes a
    limit, unless the rule is `optional`: then it is skipped, and the
    MultiDecision names it in `skipped`.

    `bucket` may be a function of the request (sync or async) returning the
    Bucket for it, for limits that depend on the caller::

        TIERS = {"free": Bucket(10, 0.17, name="user"), "pro": Bucket(100, 2, name="user")}
        Rule(lambda request: TIERS[request.state.tier], user_id())

    Buckets of one rule that share a name share the key, so a caller who
    changes tier keeps the balance it has (a higher max adds no tokens at
    once). `cost` may be a function of the request too.

    A `shadow` rule (dry-run) is charged as any other, in a call of its own
    beside the enforced rules' (`charge_shadow`), and never refuses: its
    denial is reported "shadow_mode" to the limiter's `on_decision` hook
    and logged, never answered with a 429, and puts no fields on the
    response; a request without its identity skips it.

    `block` (seconds) is a penalty, rate-limiter-flexible's
    `blockDuration`: a request the bucket denies charges it into debt
    (TB.ADJUST) so that the caller is refused for `block` seconds from the
    denial (`Limiter.consume`'s `block`). The module's floor of `-max`
    bounds it: at most `(max + cost) / rate`, checked when the rule is
    built (or, for a bucket or cost function, when a request is charged).

    `skip` lets trusted callers through: a function of the request (sync or
    async) answering True, or a set of identities (what `key` returns: API
    keys, client addresses); a skipped rule sends nothing and is named in
    `skipped`.

    A Deny in the bucket's place refuses every request the rule applies to
    (a limit of zero) without calling Redis: a 429, Retry-After its
    `retry_after`.
    """

    bucket: Union[BucketOrQuota, Deny, BucketFunc[Any]]
    key: KeyFunc[Any]
    cost: Union[float, Callable[[Any], float]] = 1
    prefix: str = "rl"
    optional: bool = False
    fallback: Optional[KeyFunc[Any]] = None
    shadow: bool = False
    block: Optional[float] = None
    skip: Union[SkipFunc[Any], frozenset[str], set[str], None] = None

    def __post_init__(self) -> None:
        if not isinstance(self.shadow, bool):
            raise TypeError(f"a Rule's shadow is True or False, got {self.shadow!r}")
        if self.skip is not None and not callable(self.skip):
            if not isinstance(self.skip, (set, frozenset)) or not all(isinstance(k, str) for k in self.skip):
                raise TypeError(f"a Rule's skip is a function of the request or a set of identities, got {self.skip!r}")
            object.__setattr__(self, "skip", frozenset(self.skip))
        if isinstance(self.bucket, Deny):
            if self.block is not None or self.shadow:
                raise ValueError(f"a Deny rule ({self.bucket.name}) takes no block and is never shadow")
        elif isinstance(self.bucket, (Bucket, Quota)):
            _check_named(self.bucket)
            if not callable(self.cost):
                check_amount(self.cost, self.bucket)
                check_block(self.block, self.bucket, float(self.cost))
            elif self.block is not None:
                check_block(self.block, self.bucket, 0)
        elif not callable(self.bucket):
            raise TypeError(f"a Rule's bucket is a Bucket, a Quota or a function of the request, got {self.bucket!r}")

    async def bucket_for(self, request: Any) -> BucketOrQuota:
        """The rule's bucket (or quota) for this request."""
        if isinstance(self.bucket, (Bucket, Quota)):
            return self.bucket
        if isinstance(self.bucket, Deny):
            raise TypeError(f"the Deny rule {self.bucket.name} has no bucket")
        return _check_named(await of_request(self.bucket, request, (Bucket, Quota), "a Rule's bucket function"))

    async def skipped(self, request: Any) -> bool:
        """Whether the request is a trusted caller's, which this rule lets
        through: `skip` answers True, or holds the request's identity."""
        if self.skip is None:
            return False
        if isinstance(self.skip, (set, frozenset)):
            identity = await of_request(self.key, request)
            if identity is None and self.fallback is not None:
                identity = await of_request(self.fallback, request)
            return identity is not None and str(identity) in self.skip
        return bool(await of_request(self.skip, request, object, "a Rule's skip function"))

    async def group(self, request: Any) -> Optional[tuple[str, BucketOrQuota, float]]:
        identity = await identity_of(self, request, lambda: self.name_for(request))
        if identity is None:
            return None
        if isinstance(self.bucket, Deny):
            raise AlwaysDenied(self.bucket)
        bucket = await self.bucket_for(request)
        cost = self.cost(request) if callable(self.cost) else self.cost
        if self.block is not None and (callable(self.bucket) or callable(self.cost)):
            check_block(self.block, bucket, float(cost))
        return (f"{self.prefix}:{bucket.name}:{identity}", bucket, cost)

    async def name_for(self, request: Any) -> str:
        """The policy's name for this request, for a refusal or a skip."""
        return await _name_of(self.bucket, lambda: self.bucket_for(request))

    def claim(self, limiter: Limiter, bucket: Optional[BucketOrQuota] = None) -> None:
        """Claims this rule's keys on the limiter (`_key_owners`): its
        bucket's, or `bucket`, one its function returned."""
        b = self.bucket
        if isinstance(b, Deny):
            return  # no key: nothing is ever sent for it
        if isinstance(b, Quota):
            claim(limiter, self, self.prefix, str(b.name), ("quota", b.limit, b.period, b.offset))
        elif isinstance(b, Bucket):
            claim(limiter, self, self.prefix, str(b.name), ("bucket", b.max, b.rate))
        elif bucket is not None:
            claim(limiter, self, self.prefix, str(bucket.name), None)


async def groups_of(
    limiter: Limiter, rules: Sequence[Rule], request: Any
) -> tuple[list[tuple[str, BucketOrQuota, float]], tuple[str, ...]]:
    """The (key, bucket, cost) of each rule that applies to the request,
    and the names of the optional ones skipped for want of an identity;
    the buckets rules' functions return claim their keys on first use."""
    ruled, skipped = await rules_of(limiter, rules, request)
    return [group for _, group in ruled], skipped


async def rules_of(
    limiter: Limiter, rules: Sequence[Rule], request: Any
) -> tuple[list[tuple[Rule, tuple[str, BucketOrQuota, float]]], tuple[str, ...]]:
    """`groups_of`, each group with its rule. A trusted caller's rule
    (`skip`) is skipped as an optional rule without an identity is; a Deny
    rule that applies raises AlwaysDenied before anything is sent."""
    groups, skipped = [], []
    for rule in rules:
        group = None if await rule.skipped(request) else await rule.group(request)
        if group is None:
            skipped.append(await rule.name_for(request))
            continue
        if not isinstance(rule.bucket, (Bucket, Quota)):
            rule.claim(limiter, group[1])
        groups.append((rule, group))
    return groups, tuple(skipped)


async def penalize(
    limiter: Limiter,
    ruled: Sequence[tuple[Rule, tuple[str, BucketOrQuota, float]]],
    decision: MultiDecision,
    timeout: Optional[float],
) -> MultiDecision:
    """The penalties of a denial (`Rule.block`): each bucket that denied it,
    whose rule has a block, charged into debt (TB.ADJUST, failing open: the
    denial stands whatever becomes of it). An admitted, shadow, cached or
    degraded decision is charged nothing."""
    if decision.allowed or decision.cached or decision.degraded or decision.shed:
        return decision
    decisions = list(decision.decisions)
    for i, ((rule, (key, bucket, _)), d) in enumerate(zip(ruled, decision.decisions, strict=False)):
        if rule.block is None:
            continue
        charge = penalty(d, rule.block)
        if charge > 0:
            adjusted = await limiter.adjust(key, bucket, -charge, timeout=timeout, on_error="open")
            decisions[i] = penalized(d, adjusted, rule.block)
    if decisions == list(decision.decisions):
        return decision
    retry = max(d.retry_after_ms for d in decisions)
    return replace(decision, decisions=tuple(decisions), retry_after_ms=retry)


def split_shadow(rules: Sequence[Rule]) -> tuple[tuple[Rule, ...], tuple[Rule, ...]]:
    """The enforced rules and the shadow ones."""
    return tuple(r for r in rules if not r.shadow), tuple(r for r in rules if r.shadow)


async def charge_shadow(limiter: Limiter, rules: Sequence[Rule], request: Any, timeout: Optional[float]) -> None:
    """Charges the shadow rules in a call of their own: the decision is all
    or nothing, so a shadow denial in the enforced call would stop the
    enforced rules' charge. Under on_error="open" and never raising: a
    shadow rule never refuses a request, whatever Redis does; its decision
    goes to the on_decision hook and the log only."""
    try:
        groups, _ = await groups_of(limiter, rules, request)
        if groups:
            await limiter.consume_many(groups, timeout=timeout, on_error="open", shadow=True)
    except Exception:
        log.exception("rate limiter: a shadow rule's call failed; the request goes on")


async def of_request(func: Callable[[Any], Any], request: Any, kind: Any = object, what: str = "") -> Any:
    """What a rule's function (sync or async) answers for this request,
    which must be a `kind`."""
    value = func(request)
    if inspect.isawaitable(value):
        value = await value
    if not isinstance(value, kind):
        kinds = " or a ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
        raise TypeError(f"{what} must return a {kinds}, got {type(value).__name__}")
    return value


async def _name_of(limit: Any, made: Callable[[], Awaitable[Any]]) -> str:
    """A rule's name: its limit's, or that of the limit its function makes.
    A request with no identity may lack what the function reads too (the
    tier its authentication sets): then the rule is "the rate limit"."""
    if not callable(limit):
        return str(limit.name)
    try:
        return str((await made()).name)
    except Exception:  # the function's own failure: this request has no limit to name
        return "rate limit"


def _check_named(bucket: BucketOrQuota) -> BucketOrQuota:
    if bucket.name is None:
        raise ValueError("a Rule's bucket needs a name: Bucket(max, rate, name='user'), Quota(limit, period, name=...)")
    return bucket


@dataclass(frozen=True)
class ConcurrencyRule:
    """At most `concurrency.limit` requests in flight per identity: each
    request takes `weight` slots of the lease key `prefix:name:identity`,
    the identity being what `key` returns (else `fallback`'s; with neither,
    a 400, or the rule skipped if `optional`), and holds them until the
    last byte of its response is sent, or its client is gone.

    `concurrency` may be a function of the request (sync or async)
    returning the Concurrency for it (the caller's tier, say); `weight` may
    be a function of the request too. The Concurrency's name names the
    policy in the headers and in `violated-policies`::

        STREAMS = {"free": Concurrency(2, 30_000, name="streams"), "pro": Concurrency(8, 30_000, name="streams")}
        ConcurrencyRule(lambda request: STREAMS[request.state.tier], user_id())
    """

    concurrency: Union[Concurrency, ConcurrencyFunc[Any]]
    key: KeyFunc[Any]
    weight: Union[int, Callable[[Any], int]] = 1
    prefix: str = "rl"
    optional: bool = False
    fallback: Optional[KeyFunc[Any]] = None

    def __post_init__(self) -> None:
        if isinstance(self.concurrency, Concurrency):
            _check_concurrency_named(self.concurrency)
            if not callable(self.weight):
                self.concurrency.check_weight(self.weight)
        elif not callable(self.concurrency):
            kind = f"got {self.concurrency!r}"
            raise TypeError(f"a ConcurrencyRule's concurrency is a Concurrency or a function of the request, {kind}")
        elif not callable(self.weight):
            check_int(self.weight, "weight", 1)

    async def concurrency_for(self, request: Any) -> Concurrency:
        """The rule's Concurrency for this request."""
        if isinstance(self.concurrency, Concurrency):
            return self.concurrency
        what = "a ConcurrencyRule's concurrency function"
        return _check_concurrency_named(await of_request(self.concurrency, request, Concurrency, what))

    async def name_for(self, request: Any) -> str:
        """The policy's name for this request, for a refusal or a skip."""
        return await _name_of(self.concurrency, lambda: self.concurrency_for(request))

    def claim(self, limiter: Limiter, concurrency: Optional[Concurrency] = None) -> None:
        """Claims this rule's lease keys on the limiter (`_key_owners`)."""
        if isinstance(self.concurrency, Concurrency):
            c = self.concurrency
            claim(limiter, self, self.prefix, str(c.name), ("lease", c.limit, c.lease_ms))
        elif concurrency is not None:
            claim(limiter, self, self.prefix, str(concurrency.name), None)

    async def slot(self, request: Any) -> Optional[tuple[str, Concurrency, int]]:
        """(lease key, Concurrency, weight) for this request, or None."""
        identity = await identity_of(self, request, lambda: self.name_for(request))
        if identity is None:
            return None
        concurrency = await self.concurrency_for(request)
        weight = self.weight(request) if callable(self.weight) else self.weight
        return (f"{self.prefix}:{concurrency.name}:{identity}", concurrency, weight)


def _check_concurrency_named(concurrency: Concurrency) -> Concurrency:
    if concurrency.name is None:
        raise ValueError("a ConcurrencyRule's Concurrency needs a name: Concurrency(8, 30_000, name='streams')")
    return concurrency


# ---- holding leases until the last byte -----------------------------------------

Then = Callable[[], Awaitable[None]]


class Holds:
    """The leases a request holds until its response's last byte: each an
    entered `hold`, renewing; `end()` releases them all (once), then runs
    what was to follow each release."""

    def __init__(self) -> None:
        self._held: list[tuple[AsyncHold, Optional[Then]]] = []
        self._ending: Optional[asyncio.Future[Any]] = None

    def add(self, hold: AsyncHold, then: Optional[Then] = None) -> None:
        self._held.append((hold, then))
        if self._ending is not None:  # the response is over already
            background(self._release([(hold, then)]))

    def end(self) -> Optional[asyncio.Future[Any]]:
        """Starts giving the slots back, at once, without waiting for it."""
        if self._ending is None and self._held:
            self._ending = background(self._release(list(self._held)))
        return self._ending

    @staticmethod
    async def _release(held: list[tuple[AsyncHold, Optional[Then]]]) -> None:
        for hold, then in held:
            await hold.__aexit__(None, None, None)
            if then is not None:
                try:
                    await then()
                except Exception:
                    log.exception("the function to run after the response's lease was released raised")
