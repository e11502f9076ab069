"""HTTP rate-limit fields of a decision.

draft-ietf-httpapi-ratelimit-headers-11, as structured-field lists with one
item per bucket, in the same order in both fields::

    RateLimit-Policy: "user";q=10;w=59, "ip";q=600;w=20
    RateLimit: "user";r=9;t=6, "ip";r=599;t=1

`q` is the burst (max, rounded down), `w` the seconds to refill all of it
(ceil(max / rate)), `r` the whole tokens left (0 while in debt), `t` the
seconds, rounded up, until that bucket stops limiting: its retry time when
it denies, else the time until it is full. A bucket without a name is
"default". A denial adds Retry-After in whole seconds, rounded up, so a
retry then passes. The legacy X-RateLimit-Limit/-Remaining describe the
most restrictive bucket only.
"""

from __future__ import annotations

import math
from typing import Union

from ._decision import Decision, MultiDecision, whole_seconds

__all__ = ["rate_limit_headers"]


def _sf_string(text: str) -> str:
    # Names are printable ASCII (Bucket checks), so escaping is all that's left.
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def rate_limit_headers(decision: Union[Decision, MultiDecision], *, legacy: bool = False) -> dict[str, str]:
    """The fields for a response to the request `decision` answered.
    Empty for a degraded decision: Redis said nothing to report."""
    if decision.degraded:
        return {}
    if isinstance(decision, MultiDecision):
        decisions, tightest = decision.decisions, decision.tightest
    else:
        decisions, tightest = (decision,), decision
    policy, current = [], []
    for d in decisions:
        name = _sf_string(d.bucket.name or "default")
        policy.append(f"{name};q={math.floor(d.bucket.max)};w={math.ceil(d.bucket.max / d.bucket.rate)}")
        current.append(f"{name};r={max(d.remaining, 0)};t={whole_seconds(d.wait_ms)}")
    headers = {"RateLimit-Policy": ", ".join(policy), "RateLimit": ", ".join(current)}
    if legacy:
        headers["X-RateLimit-Limit"] = str(math.floor(tightest.bucket.max))
        headers["X-RateLimit-Remaining"] = str(max(tightest.remaining, 0))
    if not decision.allowed:
        headers["Retry-After"] = str(decision.retry_after)
    return headers
