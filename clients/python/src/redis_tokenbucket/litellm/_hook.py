"""The CustomLogger the proxy calls: one decision before each call
(`async_pre_call_hook`), settled after it, on success with the usage the
response reports (a stream's at its end), on a failure with a whole
refund; a stream the client drops releases its slots at once."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncGenerator
from typing import Any, Optional

import redis.asyncio
from fastapi import HTTPException
from litellm.integrations.custom_logger import CustomLogger  # type: ignore[import-not-found, unused-ignore]
from litellm.proxy.common_utils.proxy_rate_limit_error import (  # type: ignore[import-not-found, unused-ignore]
    ProxyRateLimitError,
    map_v3_rate_limit_type,
)

from .._hold import background
from ..asyncio import Limiter
from ._decide import Refusal, Reservation, decide, settle, used_tokens
from ._headers import limit_headers, refusal_detail, refusal_headers
from ._limits import BadRequest, completion_budget, prompt_tokens, request_limits
from ._rules import Rules

log = logging.getLogger("redis_tokenbucket.litellm")


class TokenBucketHook(CustomLogger):  # type: ignore[misc, unused-ignore]
    """Rate limits for LiteLLM's proxy, in Redis, exact across instances.

    ``TokenBucketHook(rules)``; the proxy loads the package's instance,
    ``redis_tokenbucket.litellm.hook``, configured from the rules file
    named by TB_LITELLM_RULES (or the ``redis_tokenbucket`` section of its
    config.yaml). `limiter` replaces the one the rules describe (tests)."""

    def __init__(self, rules: Rules, limiter: Optional[Limiter] = None) -> None:
        super().__init__()
        self.rules = rules
        self._limiter = limiter
        # A Cluster limiter's keys of one request lie in several slots: its
        # leases can't carry the buckets (see _decide).
        self._cluster = limiter is not None and isinstance(limiter.client, redis.asyncio.RedisCluster)
        # The requests admitted and not yet settled, by LiteLLM's call id.
        self.open: dict[str, Reservation] = {}
        # An admitted request's x-ratelimit-* fields and when they go
        # stale, until the proxy asks for its response's headers (after
        # settling, on some paths); in admission order.
        self.headers: dict[str, tuple[float, dict[str, str]]] = {}

    @property
    def limiter(self) -> Limiter:
        """Built at the first request, on the proxy's event loop."""
        if self._limiter is None:
            client = redis.asyncio.Redis.from_url(self.rules.redis_url)
            self._limiter = Limiter(
                client, on_error=self.rules.on_error, timeout=self.rules.timeout, processes=self.rules.processes
            )
        return self._limiter

    async def async_pre_call_hook(
        self, user_api_key_dict: Any, cache: Any, data: dict[str, Any], call_type: Any
    ) -> Any:
        try:
            limits = request_limits(self.rules, user_api_key_dict, data)
            budget = completion_budget(data, self.rules.default_max_tokens)
        except BadRequest as exc:
            raise HTTPException(status_code=400, detail=str(exc)) from None
        if not limits:
            return data
        call_id = data.get("litellm_call_id")
        if not isinstance(call_id, str) or not call_id:
            call_id = data["litellm_call_id"] = str(uuid.uuid4())
        model = str(data["model"])
        prompt = prompt_tokens(model, data) if any(limit.kind == "tokens" for limit in limits) else 0
        max_wait = self.rules.max_delay
        outcome = await decide(self.limiter, limits, prompt + budget, call_id, self._cluster, max_wait)
        if isinstance(outcome, Refusal):
            raise _exception(outcome, model)
        outcome.prompt_tokens, outcome.model = prompt, model
        self.open[call_id] = outcome
        loop = asyncio.get_running_loop()
        outcome.watchdog = loop.call_later(self.rules.max_request_s, lambda: background(self._expire(call_id)))
        self._keep_headers(call_id, limit_headers(outcome.answered), loop.time())
        if outcome.delay_ms > 0:
            try:
                await self.limiter.sleep(outcome.delay_ms / 1000)  # its turn, paced by the buckets
            except asyncio.CancelledError:
                # The caller left before its turn: nothing ran, all is given back.
                reservation = self.open.pop(call_id, None)
                if reservation is not None:
                    await asyncio.shield(background(settle(self.limiter, reservation, None, ran=False)))
                raise
        return data

    async def async_post_call_response_headers_hook(
        self,
        data: dict[str, Any],
        user_api_key_dict: Any,
        response: Any,
        request_headers: Optional[dict[str, str]] = None,
        litellm_call_info: Optional[dict[str, Any]] = None,
    ) -> Optional[dict[str, str]]:
        """The x-ratelimit-* fields of an admitted request, as LiteLLM's
        own limiter sends them on a 200: what each limit had left when the
        request was admitted."""
        kept = self.headers.pop(str(data.get("litellm_call_id")), None)
        return kept[1] if kept is not None else None

    def _keep_headers(self, call_id: str, headers: dict[str, str], now: float) -> None:
        # Fields the proxy never asked for (a path without the headers hook)
        # are dropped once stale, oldest first: no timer per request.
        while self.headers:
            oldest = next(iter(self.headers))
            if self.headers[oldest][0] > now:
                break
            del self.headers[oldest]
        if headers:
            self.headers.pop(call_id, None)  # a reused id goes to the back
            self.headers[call_id] = (now + self.rules.max_request_s, headers)

    async def async_post_call_success_hook(self, data: dict[str, Any], user_api_key_dict: Any, response: Any) -> Any:
        if data.get("stream") is True:
            return None  # settled when the stream ends, with its usage
        await self._settle(data, used_tokens(response))
        return None

    async def async_post_call_failure_hook(
        self,
        request_data: dict[str, Any],
        original_exception: Exception,
        user_api_key_dict: Any,
        traceback_str: Optional[str] = None,
    ) -> Any:
        await self._settle(request_data, None)
        return None

    async def async_post_call_streaming_iterator_hook(
        self, user_api_key_dict: Any, response: Any, request_data: dict[str, Any]
    ) -> AsyncGenerator[Any, None]:
        reservation = self.open.get(str(request_data.get("litellm_call_id")))
        text: list[str] = []
        reported: Optional[int] = None
        failed = False
        try:
            async for chunk in response:
                reported = used_tokens(chunk) or reported
                if reservation is not None and reservation.tokens:
                    text.append(_delta_text(chunk))
                yield chunk
        except (GeneratorExit, asyncio.CancelledError):
            raise  # dropped by the client: what was streamed is what stays charged
        except Exception:
            failed = True
            raise
        finally:
            if reservation is not None:
                used = None if failed and not text else (reported or _stream_usage(reservation, "".join(text)))
                # Shielded: a cancelled stream still releases its slots now.
                await asyncio.shield(background(self._settle(request_data, used)))

    async def _settle(self, data: dict[str, Any], used: Optional[int]) -> None:
        reservation = self.open.pop(str(data.get("litellm_call_id")), None)
        if reservation is not None:
            await settle(self.limiter, reservation, used)

    async def _expire(self, call_id: str) -> None:
        reservation = self.open.pop(call_id, None)
        if reservation is not None:
            log.warning("request %s was not settled within %g s: its slots are released, its tokens stay charged",
                        call_id, self.rules.max_request_s)  # fmt: skip
            reservation.tokens = []
            await settle(self.limiter, reservation, None)


def _delta_text(chunk: Any) -> str:
    try:
        content = chunk.choices[0].delta.content
    except (AttributeError, IndexError, TypeError):
        return ""
    return content if isinstance(content, str) else ""


def _stream_usage(reservation: Reservation, completion: str) -> int:
    """A stream's tokens when it reports no usage: the prompt's, plus the
    streamed text's as LiteLLM counts them."""
    import litellm  # type: ignore[import-not-found, unused-ignore]

    if not completion:
        return reservation.prompt_tokens
    return reservation.prompt_tokens + int(litellm.token_counter(model=reservation.model, text=completion))


def _exception(refusal: Refusal, model: str) -> HTTPException:
    headers = refusal_headers(refusal)
    detail = refusal_detail(refusal)
    if refusal.status == 429:
        kind = map_v3_rate_limit_type(refusal.limit.kind if refusal.limit is not None else None)
        # LiteLLM's own 429 (an HTTPException and a RateLimitError): the proxy
        # answers it with its headers, and its clients know it.
        error: HTTPException = ProxyRateLimitError(detail=detail, headers=headers, rate_limit_type=kind, model=model)
        return error
    return HTTPException(status_code=refusal.status, detail=detail, headers=headers)
