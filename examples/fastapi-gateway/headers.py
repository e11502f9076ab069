"""HTTP rate-limit fields of a decision.

IETF draft (draft-ietf-httpapi-ratelimit-headers), structured fields:

  RateLimit-Policy: "user";q=10;w=59, "key";q=10;w=59, "ip";q=600;w=20
  RateLimit: "user";r=9;t=6, "key";r=9;t=6, "ip";r=599;t=1

One item per bucket checked, in the same order in both fields. q is the
burst (max), w the seconds to refill all of it (ceil(max / rate)), r the
whole tokens left, t the seconds until that bucket stops limiting: its
Retry-After when it denies, else until it is full again. The legacy
X-RateLimit-Limit/-Remaining describe the most restrictive bucket only.
"""

from __future__ import annotations

import math

from limiter import Decision


def _seconds(ms: int) -> int:
    return -(-ms // 1000)


def rate_limit_headers(decision: Decision) -> dict[str, str]:
    policy = ", ".join(
        f'"{s.dim.name}";q={math.floor(s.dim.bucket.max)};w={math.ceil(s.dim.bucket.max / s.dim.bucket.rate)}'
        for s in decision.states
    )
    # A balance in debt (after an LLM overrun) is reported as 0 left.
    current = ", ".join(
        f'"{s.dim.name}";r={max(s.remaining, 0)};t={_seconds(s.wait_ms)}' for s in decision.states
    )
    tightest = decision.tightest
    headers = {
        "RateLimit-Policy": policy,
        "RateLimit": current,
        "X-RateLimit-Limit": str(math.floor(tightest.dim.bucket.max)),
        "X-RateLimit-Remaining": str(max(tightest.remaining, 0)),
    }
    if not decision.allowed:
        headers["Retry-After"] = str(decision.retry_after)
    return headers
