"""The headers of a refusal, as LiteLLM's own limiter sends them:
`retry-after`, `rate_limit_type`, and `x-ratelimit-<dimension>-
{remaining,limit}-<kind>` for each limit that answered (`-<kind>-<period>`
for a calendar budget, as `x-ratelimit-key-remaining-tokens-month`), plus
OpenAI's `x-ratelimit-{limit,remaining}-{requests,tokens}` of the
tightest of each kind, budgets included, which OpenAI SDKs read."""

from __future__ import annotations

from typing import Union

from .._decision import Decision
from .._lease import Lease
from ._decide import Refusal
from ._limits import Limit

Answered = tuple[tuple[Limit, Union[Decision, Lease]], ...]


def limit_headers(answered: Answered) -> dict[str, str]:
    """The x-ratelimit-* fields of the limits that answered (none for an
    answer the failure policy made up: Redis said nothing to report)."""
    headers: dict[str, str] = {}
    tightest: dict[str, tuple[int, int]] = {}
    for limit, answer in answered:
        if answer.degraded or answer.shed:
            continue
        remaining = answer.remaining if isinstance(answer, Lease) else max(answer.remaining, 0)
        kind = f"{limit.kind}-{limit.period}" if limit.period else limit.kind
        headers[f"x-ratelimit-{limit.dimension}-remaining-{kind}"] = str(remaining)
        headers[f"x-ratelimit-{limit.dimension}-limit-{kind}"] = str(limit.limit)
        if limit.kind != "max_parallel_requests" and remaining < tightest.get(limit.kind, (0, remaining + 1))[1]:
            tightest[limit.kind] = (limit.limit, remaining)
    for kind, (most, left) in tightest.items():
        headers[f"x-ratelimit-limit-{kind}"] = str(most)
        headers[f"x-ratelimit-remaining-{kind}"] = str(left)
    return headers


def refusal_headers(refusal: Refusal) -> dict[str, str]:
    headers = {"retry-after": str(refusal.retry_after)}
    if refusal.limit is not None:
        headers["rate_limit_type"] = refusal.limit.kind
    headers.update(limit_headers(refusal.answered))
    return headers


def refusal_detail(refusal: Refusal) -> str:
    """What the client reads: the limit that tripped, and when to retry."""
    limit = refusal.limit
    if limit is None:
        return (
            f"Rate limiting is unavailable (Redis failing, or this proxy too busy); retry in {refusal.retry_after} s."
        )
    if limit.period is None:
        unit = {"requests": "requests a minute", "tokens": "tokens a minute", "max_parallel_requests": "in flight"}
        per = unit[limit.kind]
    elif limit.period[0].isdigit():  # a fixed period, "3600s"
        per = f"{limit.kind} per {limit.period}"
    else:
        per = f"{limit.kind} a {limit.period}"
    return (
        f"Rate limit exceeded for {limit.dimension}. Limit type: {limit.kind}. "
        f"Current limit: {limit.limit} {per}. Retry in {refusal.retry_after} s."
    )
