"""A GenAI API gateway limited per user, API key and client IP, with an LLM
token budget per user. Run: uvicorn app:app --no-proxy-headers (see README).
"""

from __future__ import annotations

import json
import logging
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import AsyncIterator, Callable, Literal, Sequence

from fastapi import APIRouter, Depends, FastAPI, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, Field
from redis.asyncio import Redis, RedisCluster
from redis_tokenbucket import Breaker, Bucket, Decision, Lease, MultiDecision, rate_limit_headers
from redis_tokenbucket.asyncio import Limiter
from redis_tokenbucket.fastapi import Rule, client_ip, hold_until_sent, install, user_id
from starlette.types import ASGIApp, Receive, Scope, Send

from auth import authenticate
from config import Limits, Principal, Settings, TierLimits
from llm import LLMBackend, LLMError, StubLLM, count_tokens

log = logging.getLogger("gateway")

# What a route does when Redis fails (refused, reset, no answer in time,
# or the breaker open after several such): admit unlimited, or refuse with
# 503; either way the limiter logs it. Cheap reads fail open; what spends
# inference budget fails closed. A busy gateway is not a failing Redis: a
# call that can't get its answer in time for local reasons is shed (503,
# Retry-After) under both policies, never admitted unchecked.
Policy = Literal["fail_open", "fail_closed"]
ON_ERROR = {"fail_open": "open", "fail_closed": "closed"}

# (key, bucket, cost): one bucket a request is charged against.
Group = tuple[str, Bucket, float]


class GatewayError(Exception):
    """An error answer with a flat JSON body."""

    def __init__(self, status: int, body: dict, headers: dict[str, str] | None = None) -> None:
        self.status, self.body, self.headers = status, body, headers


class ChatRequest(BaseModel):
    prompt: str = Field(min_length=1)
    max_tokens: int = Field(gt=0)
    # Server-sent events, one per token, instead of one JSON answer.
    stream: bool = False


def request_rules(limits: Limits) -> tuple[Rule, ...]:
    """The request's buckets: user and key when authenticated (optional
    rules: without a principal they are skipped, and the routes that need
    one answer 401), IP always (an unauthenticated flood still costs its IP). The user and key buckets' sizes are the caller's tier,
    chosen per request. Raw API keys never get here: the key bucket is named
    after the key's SHA-256."""

    def tier(request: Request) -> TierLimits:
        return limits.for_tier(request.state.tier)

    return (
        Rule(lambda request: tier(request).user.named("user"), user_id(), optional=True),
        Rule(lambda request: tier(request).key.named("key"), user_id("key_id"), optional=True),
        Rule(limits.ip.named("ip"), lambda request: request.state.client_ip),
    )


async def request_groups(request: Request) -> list[Group]:
    """`rl:<dimension>:<identity>` with the bucket and cost of each rule that
    applies to the request."""
    groups = [await rule.group(request) for rule in request.app.state.rules]
    return [group for group in groups if group is not None]


async def enforce(
    request: Request, response: Response, policy: Policy, extra: Sequence[Group] = ()
) -> MultiDecision | None:
    """One all-or-nothing check of every bucket of the request. Returns the
    decision, or None when the limiter is down and the route fails open."""
    settings: Settings = request.app.state.settings
    groups = [*await request_groups(request), *extra]
    limiter: Limiter = request.app.state.limiter
    # In cluster mode the buckets are in different slots: one by one.
    decision = await limiter.consume_many(
        groups, atomic=False if settings.cluster_mode else None, on_error=ON_ERROR[policy]
    )
    if decision.shed:
        raise GatewayError(503, {"error": "overloaded"}, {"Retry-After": str(decision.retry_after)})
    if decision.degraded:
        if not decision.allowed:
            raise GatewayError(503, {"error": "rate_limiter_unavailable"}, {"Retry-After": "1"})
        return None
    if not decision.allowed:
        raise GatewayError(
            429,
            {"error": "rate_limited", "dimension": decision.tightest.bucket.name, "retry_after": decision.retry_after},
            rate_limit_headers(decision, legacy=True),
        )
    response.headers.update(rate_limit_headers(decision, legacy=True))
    return decision


def require_principal(request: Request) -> Principal:
    if request.state.principal is None:
        raise GatewayError(401, {"error": "unauthorized", "detail": "missing or unknown X-API-Key"})
    return request.state.principal


def limited(policy: Policy) -> Callable:
    """Dependency: limit first (so bad keys still pay their IP bucket), then
    require a valid API key."""

    async def dependency(request: Request, response: Response) -> Principal:
        await enforce(request, response, policy)
        return require_principal(request)

    return dependency


router = APIRouter()


@router.get("/healthz")
async def healthz() -> dict:
    """Liveness: the process answers; Redis is /readyz's business."""
    return {"ok": True}


@router.get("/readyz")
async def readyz(request: Request) -> JSONResponse:
    """Ready when Redis answers and TB.*, the Lua library or the EVAL
    scripts work; with the limiter's breaker state ("open": Redis failed
    lately, the routes' policies answer without asking it)."""
    limiter: Limiter = request.app.state.limiter
    try:
        backend = await limiter.detect()
    except Exception as exc:  # whatever it is, this gateway can't limit
        body = {"ready": False, "reason": f"{type(exc).__name__}: {exc}", "breaker": limiter.breaker_state}
        return JSONResponse(body, status_code=503)
    return JSONResponse({"ready": True, "backend": backend, "breaker": limiter.breaker_state})


@router.get("/v1/models")
async def models(principal: Principal = Depends(limited("fail_open"))) -> dict:
    return {"data": [{"id": "stub-echo"}]}


async def settle(request: Request, budget: Group, delta: float) -> Decision | None:
    """Returns unused tokens (delta > 0) or charges an overrun (delta < 0)."""
    key, bucket, _ = budget
    # The answer is already paid for upstream; a lost settlement (logged by
    # the limiter) only skews this user's budget until it refills.
    settled = await request.app.state.limiter.adjust(key, bucket, delta, on_error="open")
    return None if settled.degraded else settled


@router.post("/v1/chat", response_model=None)
async def chat(body: ChatRequest, request: Request, response: Response) -> dict | StreamingResponse:
    """Reserves prompt + max_tokens LLM tokens in the same all-or-nothing
    check as the request buckets, calls the model, then settles: the unused
    part comes back, all of it if the model fails. A streamed chat also
    takes one of the user's `streams` slots, in that same call."""
    limits: Limits = request.app.state.settings.limits
    reserved = count_tokens(body.prompt) + body.max_tokens
    extra = []
    if (principal := request.state.principal) is not None:
        budget = limits.for_tier(principal.tier).llm
        if reserved > budget.max:  # could never pass; Redis would reject it as an error
            detail = f"{reserved} tokens exceed the budget of {budget.max:g}"
            raise GatewayError(413, {"error": "over_budget", "detail": detail})
        extra.append((f"rl:llm:user:{principal.user_id}", budget.named("llm"), float(reserved)))
        if body.stream:
            return await chat_stream(body, request, principal, extra[0], reserved)
    decision = await enforce(request, response, "fail_closed", extra)
    require_principal(request)

    llm: LLMBackend = request.app.state.llm
    try:
        completion = await llm.complete(body.prompt, body.max_tokens)
    except Exception as exc:
        if decision is not None:
            await settle(request, extra[0], reserved)
        if isinstance(exc, LLMError):
            log.warning("model backend failed, %d tokens refunded: %s", reserved, exc)
            raise GatewayError(502, {"error": "upstream_failed"}) from exc
        raise

    used = completion.prompt_tokens + completion.completion_tokens
    if decision is not None and used != reserved:
        settled = await settle(request, extra[0], reserved - used)
        if settled is not None:
            # Report the budget as it is after the refund, not the reservation.
            after = replace(settled, retry_after_ms=0)
            decisions = tuple(after if d.key == after.key else d for d in decision.decisions)
            response.headers.update(rate_limit_headers(replace(decision, decisions=decisions), legacy=True))
    return {
        "text": completion.text,
        "usage": {
            "prompt_tokens": completion.prompt_tokens,
            "completion_tokens": completion.completion_tokens,
            "reserved_tokens": reserved,
        },
    }


# The deployment's one lease key: every gateway process takes its streams'
# slots from it.
DEPLOYMENT_STREAMS_KEY = "rl:streams:deployment"


def refuse_lease(lease: Lease) -> None:
    """A streamed chat's answer when its lease was not acquired: shed or
    Redis failing (the route fails closed) is a 503, a full set of streams
    (the user's, or the deployment's) or a bucket that can't pay a 429."""
    if lease.shed:
        raise GatewayError(503, {"error": "overloaded"}, {"Retry-After": str(lease.retry_after)})
    if lease.degraded:
        raise GatewayError(503, {"error": "rate_limiter_unavailable"}, {"Retry-After": "1"})
    if lease.busy:
        dimension = lease.concurrency.name or "streams"
    else:
        dimension = max(lease.denied_by, key=lambda d: d.retry_after_ms).bucket.name
    raise GatewayError(
        429,
        {"error": "rate_limited", "dimension": dimension, "retry_after": lease.retry_after},
        rate_limit_headers(lease, legacy=True),
    )


def with_fields(fields: dict[str, str], more: dict[str, str]) -> dict[str, str]:
    """`fields` and `more`, a field in both listing both (the RateLimit
    fields are lists)."""
    out = dict(fields)
    for name, value in more.items():
        out[name] = f"{out[name]}, {value}" if name in out else value
    return out


async def give_back(limiter: Limiter, lease: Lease) -> None:
    """Releases a slot taken for a stream that won't run; left to expire
    if Redis can't take it."""
    try:
        await limiter.release(lease)
    except Exception as exc:
        log.warning("could not give back stream slot %r: %s", lease.id, exc)


async def take_stream_slots(
    request: Request, principal: Principal, budget: Group
) -> tuple[list[Lease], dict[str, str]]:
    """A slot of the deployment's `model_streams`, then one of the user's
    `streams` with every bucket of the request and the LLM reservation
    charged in that same call. The deployment's first, with no bucket: at
    its cap every request is refused there, by a cheap denial that charges
    nothing, and a user's refusal gives it back. Returns the leases and the
    response's fields."""
    settings: Settings = request.app.state.settings
    limiter: Limiter = request.app.state.limiter
    deployment = await limiter.acquire(DEPLOYMENT_STREAMS_KEY, settings.limits.deployment_streams(), on_error="closed")
    if not deployment.acquired:
        refuse_lease(deployment)
    try:
        lease, fields = await take_user_slot(request, principal, budget)
    except BaseException as exc:
        await give_back(limiter, deployment)
        if isinstance(exc, GatewayError) and exc.status == 429 and exc.headers is not None:
            # The user's refusal names both policies, as an admitted stream
            # does; the deployment's slot is back, so it counts as free.
            given_back = replace(deployment, in_use=deployment.in_use - deployment.weight)
            exc.headers = with_fields(rate_limit_headers(given_back), exc.headers)
        raise
    return [deployment, lease], with_fields(rate_limit_headers(deployment), fields)


async def take_user_slot(request: Request, principal: Principal, budget: Group) -> tuple[Lease, dict[str, str]]:
    """One of the user's `streams` slots, with every bucket of the request
    and the LLM reservation charged in the same TB.ACQUIRE, all or nothing.
    In cluster mode the buckets live in other slots than the lease key: the
    slot first, then the buckets one by one (`enforce`), and the slot given
    back if they deny. Returns the lease and the response's fields."""
    settings: Settings = request.app.state.settings
    limiter: Limiter = request.app.state.limiter
    key = f"rl:streams:{principal.user_id}"
    streams = settings.limits.streams(principal.tier)
    if not settings.cluster_mode:
        groups = [*await request_groups(request), budget]
        lease = await limiter.acquire(key, streams, buckets=groups, on_error="closed")
        if not lease.acquired:
            refuse_lease(lease)
        return lease, rate_limit_headers(lease, legacy=True)
    lease = await limiter.acquire(key, streams, on_error="closed")
    if not lease.acquired:
        refuse_lease(lease)
    try:
        decision = await enforce(request, Response(), "fail_closed", [budget])
    except BaseException:
        await give_back(limiter, lease)
        raise
    assert decision is not None  # fail_closed: a degraded answer raised
    return lease, with_fields(rate_limit_headers(lease), rate_limit_headers(decision, legacy=True))


async def chat_stream(
    body: ChatRequest, request: Request, principal: Principal, budget: Group, reserved: int
) -> StreamingResponse:
    """POST /v1/chat with "stream": true. The slot is renewed while the
    stream runs and released after its last byte, or at once when the client
    goes away; then the LLM budget is settled with what was generated (all
    of it back if nothing was)."""
    limiter: Limiter = request.app.state.limiter
    llm: LLMBackend = request.app.state.llm
    (deployment, lease), fields = await take_stream_slots(request, principal, budget)
    prompt_tokens = count_tokens(body.prompt)
    generated = 0

    async def settle_after() -> None:
        used = prompt_tokens + generated if generated else 0
        if used != reserved:
            await settle(request, budget, reserved - used)

    await hold_until_sent(request, limiter, deployment)
    await hold_until_sent(request, limiter, lease, then=settle_after)

    async def events() -> AsyncIterator[str]:
        nonlocal generated
        try:
            async for token in llm.stream(body.prompt, body.max_tokens):
                generated += 1
                yield f"data: {json.dumps({'token': token})}\n\n"
        except LLMError as exc:
            log.warning("model backend failed mid-stream after %d tokens: %s", generated, exc)
            yield f"event: error\ndata: {json.dumps({'error': 'upstream_failed'})}\n\n"
            return
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": generated, "reserved_tokens": reserved}
        yield f"data: {json.dumps({'usage': usage})}\n\n"
        yield "data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream", headers=fields)


def connect(settings: Settings) -> Redis | RedisCluster:
    timeouts = {"socket_timeout": settings.redis_timeout, "socket_connect_timeout": settings.redis_timeout}
    if settings.cluster_mode:
        return RedisCluster.from_url(settings.redis_url, **timeouts)
    return Redis.from_url(settings.redis_url, max_connections=settings.redis_max_connections, **timeouts)


class Identify:
    """Who is calling, before anything else runs: the API key's principal
    (`auth.authenticate`) and the client's address, on request.state."""

    def __init__(self, app: ASGIApp, api_keys: dict[str, Principal], address: Callable[[Request], str]) -> None:
        self.app, self.api_keys, self.address = app, api_keys, address

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            request = Request(scope)
            authenticate(request, self.api_keys)
            request.state.client_ip = self.address(request)
        await self.app(scope, receive, send)


def create_app(
    settings: Settings | None = None,
    llm: LLMBackend | None = None,
    redis_factory: Callable[[], Redis | RedisCluster] | None = None,
) -> FastAPI:
    settings = settings or Settings.from_env()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # Created here, on the server's event loop, which its connections
        # belong to. Redis may be down now: detection happens on first use.
        redis = redis_factory() if redis_factory else connect(settings)
        breaker = Breaker(settings.breaker_failures, settings.breaker_window, settings.breaker_cooldown)
        app.state.limiter = Limiter(
            redis, timeout=settings.redis_timeout, breaker=breaker, denial_cache=settings.denial_cache or None
        )
        try:
            yield
        finally:
            await app.state.limiter.aclose()
            await redis.aclose()

    app = FastAPI(title="redis-tokenbucket gateway example", lifespan=lifespan)
    app.state.settings = settings
    app.state.rules = request_rules(settings.limits)
    app.state.llm = llm or StubLLM(settings.stub_token_delay_ms)
    address = client_ip(settings.trusted_proxies)

    # A plain ASGI middleware: Starlette's @app.middleware("http") runs each
    # request in a task of its own, with streams between the two, which was
    # a fifth of a worker's time under load (docs/benchmarks.md).
    app.add_middleware(Identify, api_keys=settings.api_keys, address=address)

    # Outermost: it releases a streamed chat's slot after the last byte, or
    # as soon as the server reports the client gone.
    install(app)

    @app.exception_handler(GatewayError)
    async def gateway_error(request: Request, exc: GatewayError) -> JSONResponse:
        return JSONResponse(exc.body, status_code=exc.status, headers=exc.headers)

    app.include_router(router)
    return app


# Logging is the server's to configure (uvicorn --log-config); without it
# the warnings and errors this module logs still reach stderr.
app = create_app()
