"""Starlette (and FastAPI, a Starlette app): the ASGI middlewares, the
key functions that read a Starlette request, and the refusal as a
response. `fastapi` adds the dependencies and re-exports what is here;
the framework-neutral part is `_http`. The Node package's twins are
express.ts and fastify.ts.
"""

# No `from __future__ import annotations`, as in `fastapi`: the classes
# here are exported from there, and keep their annotations as objects.
import asyncio
import hashlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import Optional, Union

from starlette.datastructures import MutableHeaders
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from . import _http
from ._decision import MultiDecision
from ._hold import AsyncHold
from ._http import (
    PROBLEM_JSON,
    ConcurrencyRule,
    Holds,
    IPNetwork,
    Refusal,
    Refused,
    Rule,
    add_fields,
    charge_shadow,
    client_address,
    groups_of,
    penalize,
    refusal_of,
    rules_of,
    split_shadow,
    trusted_networks,
)
from ._lease import Busy, Concurrency, Lease
from ._requests import OnError
from .asyncio import Limiter
from .headers import rate_limit_headers

KeyFunc = _http.KeyFunc[Request]
"""The request's identity for one rule, or None to skip the rule."""

BucketFunc = _http.BucketFunc[Request]
"""The bucket for this request (the caller's tier, say)."""

ConcurrencyFunc = _http.ConcurrencyFunc[Request]
"""The Concurrency for this request (the caller's tier, say)."""

# Where install(app)'s middleware leaves the dependencies the fields to
# send, and the leases to hold until the response's last byte.
HEADERS_SCOPE_KEY = "redis_tokenbucket.headers"
HOLDS_SCOPE_KEY = "redis_tokenbucket.holds"


# ---- key functions ------------------------------------------------------------


def user_id(attribute: str = "user_id") -> KeyFunc:
    """`request.state.<attribute>`, as your authentication set it; None
    (rule skipped) for anonymous requests."""

    def key(request: Request) -> Optional[str]:
        value = getattr(request.state, attribute, None)
        return None if value is None else str(value)

    return key


def api_key(header: str = "X-API-Key") -> KeyFunc:
    """The SHA-256 of the API key header: a high-entropy key can't be
    recovered from it, so raw keys never reach Redis. None without the
    header. (Limit unauthenticated keys too: guessing keys then costs.)"""

    def key(request: Request) -> Optional[str]:
        raw = request.headers.get(header)
        return hashlib.sha256(raw.encode()).hexdigest() if raw else None

    return key


def client_ip(trusted_proxies: Iterable[Union[str, IPNetwork]] = ()) -> KeyFunc:
    """The client's address: the socket peer, unless the peer is a trusted
    proxy, in which case X-Forwarded-For is walked from the right (each
    proxy appends the address it received from) to the first untrusted hop.

    Anyone can send X-Forwarded-For, so believing it from any peer would let
    a client pick its own bucket, a fresh one per request. Hops left of the
    first untrusted one were written by the client and are ignored; a
    malformed hop ends the walk at the proxy that passed it on. IPv6
    clients count per /64 (a subscriber usually holds one and can rotate
    through it); IPv4-mapped addresses count as IPv4.
    """
    trusted = trusted_networks(trusted_proxies)

    def key(request: Request) -> str:
        peer = request.client.host if request.client else ""
        return client_address(peer, request.headers.getlist("x-forwarded-for"), trusted)

    return key


# ---- the answer and the fields ---------------------------------------------------


def problem_response(decision: Union[MultiDecision, Lease], *, legacy_headers: bool = False) -> JSONResponse:
    """The refusal for a denial: a 429 with the RateLimit fields,
    Retry-After and a problem+json body naming the policies that refused;
    a 503 with Retry-After for a denial nothing counted (shed, or Redis
    failing under "closed"), never a 429 with "retry now" (_http.refusal_of)."""
    return refusal_response(refusal_of(decision, legacy_headers=legacy_headers))


def refusal_response(answer: Refusal) -> JSONResponse:
    return JSONResponse(answer.body, status_code=answer.status, headers=answer.headers, media_type=PROBLEM_JSON)


class RateLimitHeaders:
    """ASGI middleware that `install(app)` adds: the fields the
    `RateLimit` and `ConcurrencyLimit` dependencies chose for a request go
    on its response, however the route built it (without it, FastAPI keeps
    them only on responses it builds from a route's return value); and the
    leases they took (or `hold_until_sent` was given) are renewed until the
    response's last byte is sent, or the client is gone, and released then."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        # Filled by the dependencies: shared by any copy of the scope made further in.
        headers: dict[str, str] = {}
        scope[HEADERS_SCOPE_KEY] = headers
        holds = scope[HOLDS_SCOPE_KEY] = Holds()

        await _run_holding(self.app, scope, receive, _with_fields(send, headers), holds)


def _with_fields(send: Send, fields: dict[str, str]) -> Send:
    """`send`, with `fields` (as they are by then) put on the response."""

    async def send_with_fields(message: Message) -> None:
        if message["type"] == "http.response.start" and fields:
            _merge_fields(message, fields)
        await send(message)

    return send_with_fields


def _merge_fields(message: Message, fields: dict[str, str]) -> None:
    """A middleware's fields onto a response that an inner limiter (a
    dependency, another middleware) may have given fields of its own."""
    add_fields(MutableHeaders(scope=message), fields)


async def _run_holding(app: ASGIApp, scope: Scope, receive: Receive, send: Send, holds: Holds) -> None:
    """Runs the app; its leases are released when the last byte of the
    response is sent, when the server reports the client gone (an
    http.disconnect, a send that fails), or when the app ends, whichever is
    first. A StreamingResponse (Starlette's) listens for the disconnect, so
    a client that goes away frees its slot at once, not at the lease's
    expiry."""

    async def watch_receive() -> Message:
        message = await receive()
        if message["type"] == "http.disconnect":
            holds.end()
        return message

    async def watch_send(message: Message) -> None:
        try:
            await send(message)
        except OSError:
            holds.end()
            raise
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            holds.end()

    try:
        await app(scope, watch_receive, watch_send)
    finally:
        ending = holds.end()
        if ending is not None:
            # Shielded: a cancelled request still gives its slots back.
            await asyncio.shield(ending)


# ---- what the dependencies and the middlewares share -------------------------------


class RateLimitBase:
    """What the `RateLimit` dependency and `RateLimitMiddleware` share: the
    request charged against `rules` at once (`consume_many`), and the
    answer and fields for the decision."""

    def __init__(
        self,
        limiter: Limiter,
        *rules: Rule,
        on_error: Optional[OnError] = None,
        timeout: Optional[float] = None,
        atomic: Optional[bool] = None,
        legacy_headers: bool = False,
        max_delay: Optional[float] = None,
    ) -> None:
        if not rules:
            raise ValueError("RateLimit needs at least one Rule")
        for rule in rules:
            rule.claim(limiter)
        self.limiter = limiter
        self.rules: Sequence[Rule] = rules
        self._enforced, self._shadow = split_shadow(rules)
        self._block = any(r.block is not None for r in self._enforced)
        self.on_error = on_error
        self.timeout = timeout
        self.atomic = atomic
        self.legacy_headers = legacy_headers
        self.max_delay = max_delay

    async def check(self, request: Request) -> MultiDecision:
        """Charges the request (no decisions, and the rules in `skipped`,
        when every rule is optional and has no identity; MissingIdentity
        when a rule that is not has none). With `max_delay` (seconds), a
        request the buckets can serve within it is admitted and delayed by
        its reservation's wait, not refused. The shadow rules are charged
        beside, in a call of their own (`charge_shadow`)."""
        ruled, skipped = await rules_of(self.limiter, self._enforced, request)
        groups = [group for _, group in ruled]
        shadow = charge_shadow(self.limiter, self._shadow, request, self.timeout) if self._shadow else None
        if not groups:
            if shadow is not None:
                await shadow
            return MultiDecision(True, 0, (), skipped=skipped)
        enforced = self.limiter.consume_many(
            groups, atomic=self.atomic, max_wait=self.max_delay, timeout=self.timeout, on_error=self.on_error
        )
        if shadow is None:
            decision = await enforced
        else:
            decision, _ = await asyncio.gather(enforced, shadow)
        if self._block:
            decision = await penalize(self.limiter, ruled, decision, self.timeout)
        if decision.delay_ms > 0 and not decision.degraded:
            await self.limiter.sleep(decision.delay_ms / 1000)
        return replace(decision, skipped=skipped) if skipped else decision

    def answer(self, decision: MultiDecision) -> Optional[JSONResponse]:
        """The refusal to send, or None to let the request through."""
        return None if decision.allowed else problem_response(decision, legacy_headers=self.legacy_headers)

    def headers(self, decision: MultiDecision) -> dict[str, str]:
        return rate_limit_headers(decision, legacy=self.legacy_headers)


class ConcurrencyLimitBase:
    """What the `ConcurrencyLimit` dependency and `ConcurrencyMiddleware`
    share: the request's slot of `rule` acquired, its buckets charged in
    the same decision, and the answer and fields for the lease."""

    def __init__(
        self,
        limiter: Limiter,
        rule: ConcurrencyRule,
        *rules: Rule,
        on_error: Optional[OnError] = None,
        timeout: Optional[float] = None,
        legacy_headers: bool = False,
    ) -> None:
        if not isinstance(rule, ConcurrencyRule):
            raise TypeError(f"ConcurrencyLimit needs a ConcurrencyRule first, got {type(rule).__name__}")
        rule.claim(limiter)
        for bucket_rule in rules:
            bucket_rule.claim(limiter)
        self.limiter = limiter
        self.rule = rule
        self.rules: Sequence[Rule] = rules
        self._enforced, self._shadow = split_shadow(rules)
        self.on_error = on_error
        self.timeout = timeout
        self.legacy_headers = legacy_headers

    async def hold(self, request: Request) -> Optional[tuple[Lease, Optional[AsyncHold]]]:
        """Acquires the request's slot (and charges its buckets): the Lease,
        and the entered hold that renews it when it was acquired; None when
        the rule is optional and has no identity for the request."""
        slot = await self.rule.slot(request)
        if slot is None:
            return None
        key, concurrency, weight = slot
        if not isinstance(self.rule.concurrency, Concurrency):
            self.rule.claim(self.limiter, concurrency)
        if self._shadow:
            await charge_shadow(self.limiter, self._shadow, request, self.timeout)
        groups, _ = await groups_of(self.limiter, self._enforced, request)
        hold = self.limiter.hold(
            key, concurrency, weight, groups, timeout=self.timeout, on_error=self.on_error
        )  # fmt: skip
        try:
            return await hold.__aenter__(), hold
        except Busy as busy:
            return busy.lease, None

    def answer(self, lease: Lease) -> Optional[JSONResponse]:
        """The refusal to send, or None to let the request through."""
        return None if lease.acquired else problem_response(lease, legacy_headers=self.legacy_headers)

    def headers(self, lease: Lease) -> dict[str, str]:
        return rate_limit_headers(lease, legacy=self.legacy_headers)


# ---- the middlewares ---------------------------------------------------------------


def _limited_request(scope: Scope, exempt: Optional[Callable[[Request], bool]]) -> Optional[Request]:
    """The request a middleware limits; None for what it passes through
    untouched (not HTTP, or exempt)."""
    if scope["type"] != "http":
        return None
    request = Request(scope)
    return None if exempt is not None and exempt(request) else request


class RateLimitMiddleware:
    """ASGI middleware charging every HTTP request against `rules`, for
    all routes at once: ``app.add_middleware(RateLimitMiddleware,
    limiter=limiter, rules=[...])``. `exempt(request)` True skips a request
    (health checks, say)."""

    def __init__(
        self,
        app: ASGIApp,
        limiter: Limiter,
        rules: Sequence[Rule],
        *,
        on_error: Optional[OnError] = None,
        timeout: Optional[float] = None,
        atomic: Optional[bool] = None,
        legacy_headers: bool = False,
        exempt: Optional[Callable[[Request], bool]] = None,
        max_delay: Optional[float] = None,
    ) -> None:
        self.app = app
        self.limit = RateLimitBase(
            limiter,
            *rules,
            on_error=on_error,
            timeout=timeout,
            atomic=atomic,
            legacy_headers=legacy_headers,
            max_delay=max_delay,
        )
        self.exempt = exempt

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = _limited_request(scope, self.exempt)
        try:
            decision = None if request is None else await self.limit.check(request)
        except Refused as missing:
            await refusal_response(missing.refusal)(scope, receive, send)
            return
        if decision is None:
            await self.app(scope, receive, send)
            return
        refusal = self.limit.answer(decision)
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        await self.app(scope, receive, _with_fields(send, self.limit.headers(decision)))


class ConcurrencyMiddleware:
    """ASGI middleware holding a slot of `rule` for every HTTP request until
    the last byte of its response is sent, or its client is gone:
    ``app.add_middleware(ConcurrencyMiddleware, limiter=limiter,
    rule=ConcurrencyRule(...))``. Bucket `rules` are charged in the same
    decision; `exempt(request)` True skips a request. Answers as
    ConcurrencyLimit does; needs no install(app)."""

    def __init__(
        self,
        app: ASGIApp,
        limiter: Limiter,
        rule: ConcurrencyRule,
        rules: Sequence[Rule] = (),
        *,
        on_error: Optional[OnError] = None,
        timeout: Optional[float] = None,
        legacy_headers: bool = False,
        exempt: Optional[Callable[[Request], bool]] = None,
    ) -> None:
        self.app = app
        self.limit = ConcurrencyLimitBase(
            limiter, rule, *rules, on_error=on_error, timeout=timeout, legacy_headers=legacy_headers
        )
        self.exempt = exempt

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = _limited_request(scope, self.exempt)
        try:
            held = None if request is None else await self.limit.hold(request)
        except Refused as missing:
            await refusal_response(missing.refusal)(scope, receive, send)
            return
        if held is None:
            await self.app(scope, receive, send)
            return
        lease, hold = held
        refusal = self.limit.answer(lease)
        if refusal is not None or hold is None:
            assert refusal is not None
            await refusal(scope, receive, send)
            return
        holds = Holds()
        holds.add(hold)
        await _run_holding(self.app, scope, receive, _with_fields(send, self.limit.headers(lease)), holds)
