"""FastAPI and Starlette: a dependency, an ASGI middleware, key functions,
and the 429 answer. Needs the extra: ``pip install redis-tokenbucket[fastapi]``.

    limiter = Limiter(redis.asyncio.Redis())
    per_ip = Rule(Bucket(600, 30, name="ip"), client_ip(trusted_proxies=["10.0.0.0/8"]))
    per_key = Rule(Bucket(10, 0.17, name="key"), api_key())

    app = FastAPI()
    install(app)  # the 429/503 problem+json answers, and the fields on every response

    @app.get("/v1/models", dependencies=[Depends(RateLimit(limiter, per_key, per_ip))])
    async def models() -> dict:
        return {"data": []}

    # or every route: app.add_middleware(RateLimitMiddleware, limiter=limiter, rules=[per_key, per_ip])

Every request is charged against all its rules at once (`consume_many`:
all or nothing). Admitted responses carry the RateLimit fields; a denial
is a 429 with them, Retry-After and an RFC 9457 problem body of type
quota-exceeded naming the violated policies. A call refused without
Redis's word (shed under overload, or Redis failing under the policy
"closed") is a 503 with Retry-After; "open" admits without fields.
"""

# No `from __future__ import annotations` here: FastAPI reads the
# dependency's signature at run time, and can't resolve string annotations
# on a callable instance.
import asyncio
import hashlib
import json
import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Optional, Union

from starlette.datastructures import MutableHeaders
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from . import _http
from ._decision import MultiDecision
from ._hold import AsyncHold
from ._http import (
    PROBLEM_JSON,
    QUOTA_EXCEEDED,
    ConcurrencyRule,
    Holds,
    IPNetwork,
    Refusal,
    Rule,
    Then,
    add_fields,
    client_address,
    groups_of,
    refusal_of,
    trusted_networks,
)
from ._lease import Busy, Concurrency, Lease
from ._requests import OnError
from .asyncio import Limiter
from .headers import rate_limit_headers

__all__ = [
    "QUOTA_EXCEEDED",
    "BucketFunc",
    "ConcurrencyFunc",
    "ConcurrencyLimit",
    "ConcurrencyMiddleware",
    "ConcurrencyRule",
    "KeyFunc",
    "RateLimit",
    "RateLimitHeaders",
    "RateLimitMiddleware",
    "RateLimitRefused",
    "Rule",
    "api_key",
    "client_ip",
    "hold_until_sent",
    "install",
    "problem_response",
    "user_id",
]


KeyFunc = _http.KeyFunc[Request]
"""The request's identity for one rule, or None to skip the rule."""

BucketFunc = _http.BucketFunc[Request]
"""The bucket for this request (the caller's tier, say)."""

ConcurrencyFunc = _http.ConcurrencyFunc[Request]
"""The Concurrency for this request (the caller's tier, say)."""

# Where install(app)'s middleware leaves the dependency the fields to send,
# and the leases to hold until the response's last byte.
_HEADERS_SCOPE_KEY = "redis_tokenbucket.headers"
_HOLDS_SCOPE_KEY = "redis_tokenbucket.holds"

log = logging.getLogger("redis_tokenbucket")


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


# ---- rules and answers ----------------------------------------------------------


def problem_response(decision: Union[MultiDecision, Lease], *, legacy_headers: bool = False) -> JSONResponse:
    """The refusal for a denial: a 429 with the RateLimit fields,
    Retry-After and a problem+json body naming the policies that refused;
    a 503 with Retry-After for a denial nothing counted (shed, or Redis
    failing under "closed"), never a 429 with "retry now" (_http.refusal_of)."""
    return _response(refusal_of(decision, legacy_headers=legacy_headers))


def _response(answer: Refusal) -> JSONResponse:
    return JSONResponse(answer.body, status_code=answer.status, headers=answer.headers, media_type=PROBLEM_JSON)


class RateLimitRefused(HTTPException):
    """Raised by the dependency to turn a request away; `response` is the
    answer (429, or 503 when failing closed). `install(app)` sends it as
    is; without that, FastAPI's default handler still sends the status and
    headers, with the problem under "detail"."""

    def __init__(self, response: JSONResponse, body: Any) -> None:
        headers = {k: v for k, v in response.headers.items() if k not in ("content-length", "content-type")}
        super().__init__(response.status_code, detail=body, headers=headers)
        self.response = response


async def _refused_handler(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RateLimitRefused)
    return exc.response


def install(app: Any) -> None:
    """Prepares a FastAPI or Starlette app for the `RateLimit` and
    `ConcurrencyLimit` dependencies: registers the handler that sends
    `RateLimitRefused` answers as they are, and a middleware that puts the
    admitted request's RateLimit fields on whatever response the route
    sends (a dict FastAPI serialises, or a Response the route builds
    itself: JSONResponse, StreamingResponse...), and holds the request's
    leases until the response's last byte is sent. Call it before the app
    starts."""
    app.add_exception_handler(RateLimitRefused, _refused_handler)
    app.add_middleware(RateLimitHeaders)


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
        scope[_HEADERS_SCOPE_KEY] = headers
        holds = scope[_HOLDS_SCOPE_KEY] = Holds()

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start" and headers:
                _merge_fields(message, headers)
            await send(message)

        await _run_holding(self.app, scope, receive, send_with_headers, holds)


def _merge_fields(message: Message, fields: dict[str, str]) -> None:
    """A middleware's fields onto a response that an inner limiter (a
    dependency, another middleware) may have given fields of its own."""
    add_fields(MutableHeaders(scope=message), fields)


# ---- holding leases until the last byte -----------------------------------------


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


async def hold_until_sent(request: Request, limiter: Limiter, lease: Lease, then: Optional[Then] = None) -> None:
    """Holds a lease a route acquired itself (`limiter.acquire`) until the
    last byte of the response is sent, or the client is gone: renewed in the
    background about every `lease_ms / 3` until then, released then, and
    `then()` awaited after the release (to settle a budget, say). Needs
    `install(app)`. `Busy` if the lease was not acquired."""
    holds = request.scope.get(_HOLDS_SCOPE_KEY)
    if not isinstance(holds, Holds):
        raise RuntimeError(_NEEDS_INSTALL)
    hold = limiter.keep(lease)
    await hold.__aenter__()
    holds.add(hold, then)


_NEEDS_INSTALL = (
    "holding a lease until the response is sent needs install(app): its middleware releases the lease after "
    "the last byte (use ConcurrencyMiddleware for an app without it)"
)


# ---- the dependency and the middleware ------------------------------------------------


class RateLimit:
    """A dependency charging each request against `rules`:
    ``Depends(RateLimit(limiter, rule, ...))``. Returns the MultiDecision
    (None when no rule applied, or a degraded one when failing open)."""

    def __init__(
        self,
        limiter: Limiter,
        *rules: Rule,
        on_error: Optional[OnError] = None,
        timeout: Optional[float] = None,
        atomic: Optional[bool] = None,
        legacy_headers: bool = False,
    ) -> None:
        if not rules:
            raise ValueError("RateLimit needs at least one Rule")
        for rule in rules:
            rule.claim(limiter)
        self.limiter = limiter
        self.rules: Sequence[Rule] = rules
        self.on_error = on_error
        self.timeout = timeout
        self.atomic = atomic
        self.legacy_headers = legacy_headers
        self._warned = False  # about a missing install(app), once

    async def check(self, request: Request) -> Optional[MultiDecision]:
        """Charges the request; None when no rule applies to it."""
        groups = await groups_of(self.limiter, self.rules, request)
        if not groups:
            return None
        return await self.limiter.consume_many(groups, atomic=self.atomic, timeout=self.timeout, on_error=self.on_error)

    def answer(self, decision: MultiDecision) -> Optional[JSONResponse]:
        """The refusal to send, or None to let the request through."""
        if decision.allowed:
            return None
        return problem_response(decision, legacy_headers=self.legacy_headers)

    def headers(self, decision: MultiDecision) -> dict[str, str]:
        return rate_limit_headers(decision, legacy=self.legacy_headers)

    async def __call__(self, request: Request, response: Response) -> Optional[MultiDecision]:
        decision = await self.check(request)
        if decision is None:
            return None
        chosen: Optional[dict[str, str]] = request.scope.get(_HEADERS_SCOPE_KEY)
        refusal = self.answer(decision)
        if refusal is not None:
            if chosen is not None:
                chosen.clear()  # the refusal carries its own
            raise RateLimitRefused(refusal, _body(refusal))
        if chosen is not None:
            add_fields(chosen, self.headers(decision))
            return decision
        if not self._warned:
            self._warned = True
            log.warning(
                "RateLimit is used without install(app): its RateLimit fields reach only the responses FastAPI "
                "builds from a route's return value, not a Response the route returns itself"
            )
        response.headers.update(self.headers(decision))
        return decision


def _body(response: JSONResponse) -> Any:
    return json.loads(bytes(response.body))


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
    ) -> None:
        self.app = app
        self.limit = RateLimit(
            limiter, *rules, on_error=on_error, timeout=timeout, atomic=atomic, legacy_headers=legacy_headers
        )
        self.exempt = exempt

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = _limited_request(scope, self.exempt)
        if request is None:
            await self.app(scope, receive, send)
            return
        decision = await self.limit.check(request)
        if decision is None:
            await self.app(scope, receive, send)
            return
        refusal = self.limit.answer(decision)
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        headers = self.limit.headers(decision)

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                _merge_fields(message, headers)
            await send(message)

        await self.app(scope, receive, send_with_headers)


# ---- concurrency: slots held while a response is sent ------------------------------


class ConcurrencyLimit:
    """A dependency that holds a slot of `rule` for each request until the
    last byte of its response is sent (a StreamingResponse's too: until the
    stream ends or the client goes away): ``Depends(ConcurrencyLimit(limiter,
    rule))``. Needs `install(app)`, whose middleware releases the slot.

    Bucket `rules` are charged in the same decision (one TB.ACQUIRE, all or
    nothing); on a Redis Cluster their keys and the lease key must share a
    hash slot (CrossSlotError otherwise), so use RateLimit for buckets that
    can't. No slot free is a 429 with Retry-After and the RateLimit fields
    (`"streams";q=8;qu="concurrent-requests"`); a shed request or Redis
    failing under "closed" is a 503; "open" admits. Returns the Lease (None
    when the rule does not apply)."""

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
        self.on_error = on_error
        self.timeout = timeout
        self.legacy_headers = legacy_headers

    async def hold(self, request: Request) -> Optional[tuple[Lease, Optional[AsyncHold]]]:
        """Acquires the request's slot (and charges its buckets): the Lease,
        and the entered hold that renews it when it was acquired; None when
        the rule does not apply."""
        slot = await self.rule.slot(request)
        if slot is None:
            return None
        key, concurrency, weight = slot
        if not isinstance(self.rule.concurrency, Concurrency):
            self.rule.claim(self.limiter, concurrency)
        groups = await groups_of(self.limiter, self.rules, request)
        hold = self.limiter.hold(
            key, concurrency, weight, groups, timeout=self.timeout, on_error=self.on_error
        )  # fmt: skip
        try:
            return await hold.__aenter__(), hold
        except Busy as busy:
            return busy.lease, None

    def answer(self, lease: Lease) -> Optional[JSONResponse]:
        """The refusal to send, or None to let the request through."""
        if lease.acquired:
            return None
        return problem_response(lease, legacy_headers=self.legacy_headers)

    def headers(self, lease: Lease) -> dict[str, str]:
        return rate_limit_headers(lease, legacy=self.legacy_headers)

    async def __call__(self, request: Request) -> Optional[Lease]:
        holds = request.scope.get(_HOLDS_SCOPE_KEY)
        if not isinstance(holds, Holds):
            raise RuntimeError(_NEEDS_INSTALL)
        held = await self.hold(request)
        if held is None:
            return None
        lease, hold = held
        chosen: dict[str, str] = request.scope[_HEADERS_SCOPE_KEY]
        refusal = self.answer(lease)
        if refusal is not None or hold is None:
            assert refusal is not None
            chosen.clear()  # the refusal carries its own
            raise RateLimitRefused(refusal, _body(refusal))
        holds.add(hold)
        add_fields(chosen, self.headers(lease))
        return lease


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
        self.limit = ConcurrencyLimit(
            limiter, rule, *rules, on_error=on_error, timeout=timeout, legacy_headers=legacy_headers
        )
        self.exempt = exempt

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = _limited_request(scope, self.exempt)
        if request is None:
            await self.app(scope, receive, send)
            return
        held = await self.limit.hold(request)
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
        headers = self.limit.headers(lease)

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                _merge_fields(message, headers)
            await send(message)

        await _run_holding(self.app, scope, receive, send_with_headers, holds)
