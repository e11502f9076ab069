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
import json
import logging
from typing import Any, NoReturn, Optional

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ._decision import MultiDecision
from ._http import (
    QUOTA_EXCEEDED,
    AlwaysDenied,
    ConcurrencyRule,
    Deny,
    Holds,
    MissingIdentity,
    Refused,
    Rule,
    Then,
    add_fields,
)
from ._lease import Lease
from ._requests import OnError
from ._starlette import (
    HEADERS_SCOPE_KEY,
    HOLDS_SCOPE_KEY,
    BucketFunc,
    ConcurrencyFunc,
    ConcurrencyLimitBase,
    ConcurrencyMiddleware,
    KeyFunc,
    RateLimitBase,
    RateLimitHeaders,
    RateLimitMiddleware,
    api_key,
    client_ip,
    problem_response,
    refusal_response,
    user_id,
)
from .asyncio import Limiter

__all__ = [
    "QUOTA_EXCEEDED",
    "AlwaysDenied",
    "BucketFunc",
    "ConcurrencyFunc",
    "ConcurrencyLimit",
    "ConcurrencyMiddleware",
    "ConcurrencyRule",
    "Deny",
    "KeyFunc",
    "MissingIdentity",
    "RateLimit",
    "RateLimitHeaders",
    "RateLimitMiddleware",
    "RateLimitRefused",
    "Refused",
    "Rule",
    "api_key",
    "client_ip",
    "hold_until_sent",
    "install",
    "problem_response",
    "user_id",
]


log = logging.getLogger("redis_tokenbucket")


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
    global _installed
    _installed = True
    app.add_exception_handler(RateLimitRefused, _refused_handler)
    app.add_middleware(RateLimitHeaders)


# Whether install(app) has run in this process: what ConcurrencyLimit's
# startup check asks, since a dependency never sees its app before a request.
_installed = False


async def hold_until_sent(request: Request, limiter: Limiter, lease: Lease, then: Optional[Then] = None) -> None:
    """Holds a lease a route acquired itself (`limiter.acquire`) until the
    last byte of the response is sent, or the client is gone: renewed in the
    background about every `lease_ms / 3` until then, released then, and
    `then()` awaited after the release (to settle a budget, say). Needs
    `install(app)`. `Busy` if the lease was not acquired."""
    holds = request.scope.get(HOLDS_SCOPE_KEY)
    if not isinstance(holds, Holds):
        _refuse_uninstalled()
    hold = limiter.keep(lease)
    await hold.__aenter__()
    holds.add(hold, then)


_NEEDS_INSTALL = (
    "holding a lease until the response is sent needs install(app): its middleware releases the lease after "
    "the last byte (use ConcurrencyMiddleware for an app without it)"
)
_told_uninstalled = False


def _refuse_uninstalled() -> NoReturn:
    """A request that needs install(app)'s middleware in an app without
    it: nothing can release its slot, so it is refused with a 500 naming
    the fix, logged once rather than a traceback per request."""
    global _told_uninstalled
    if not _told_uninstalled:
        _told_uninstalled = True
        log.error("%s; every request that holds a slot is refused with a 500 until it is called", _NEEDS_INSTALL)
    body = {"type": "about:blank", "title": "Internal Server Error", "status": 500, "detail": _NEEDS_INSTALL}
    raise RateLimitRefused(JSONResponse(body, status_code=500), body)


def _check_installed_at_startup() -> None:
    """Says at startup, once, that install(app) was never called, where it
    can: an ASGI server that loads the app inside its event loop (uvicorn
    does) runs this once the app's module has run, before any request. A
    dependency built outside a running loop is checked at its first request."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return

    def check() -> None:
        global _told_uninstalled
        if not _installed and not _told_uninstalled:
            _told_uninstalled = True
            log.error("ConcurrencyLimit is used, and install(app) was not called as the app loaded: %s", _NEEDS_INSTALL)

    loop.call_soon(check)


# ---- the dependencies ------------------------------------------------------------------


class RateLimit(RateLimitBase):
    """A dependency charging each request against `rules`:
    ``Depends(RateLimit(limiter, rule, ...))``. Returns the MultiDecision
    (a degraded one when failing open; with no decisions when every rule
    was optional and skipped, which `skipped` names). A request with no
    identity for a rule that is not optional is refused with a 400."""

    _warned = False  # about a missing install(app), once

    async def __call__(self, request: Request, response: Response) -> MultiDecision:
        try:
            decision = await self.check(request)
        except Refused as missing:
            raise RateLimitRefused(refusal_response(missing.refusal), missing.refusal.body) from None
        chosen: Optional[dict[str, str]] = request.scope.get(HEADERS_SCOPE_KEY)
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


class ConcurrencyLimit(ConcurrencyLimitBase):
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
        super().__init__(limiter, rule, *rules, on_error=on_error, timeout=timeout, legacy_headers=legacy_headers)
        _check_installed_at_startup()

    async def __call__(self, request: Request) -> Optional[Lease]:
        holds = request.scope.get(HOLDS_SCOPE_KEY)
        if not isinstance(holds, Holds):
            _refuse_uninstalled()
        try:
            held = await self.hold(request)
        except Refused as missing:
            raise RateLimitRefused(refusal_response(missing.refusal), missing.refusal.body) from None
        if held is None:
            return None
        lease, hold = held
        chosen: dict[str, str] = request.scope[HEADERS_SCOPE_KEY]
        refusal = self.answer(lease)
        if refusal is not None or hold is None:
            assert refusal is not None
            chosen.clear()  # the refusal carries its own
            raise RateLimitRefused(refusal, _body(refusal))
        holds.add(hold)
        add_fields(chosen, self.headers(lease))
        return lease
