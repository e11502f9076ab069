"""HTTP rate-limit fields of a decision.

draft-ietf-httpapi-ratelimit-headers-11, as structured-field lists with one
item per bucket, in the same order in both fields::

    RateLimit-Policy: "user";q=10;w=59, "ip";q=600;w=20
    RateLimit: "user";r=9;t=6, "ip";r=599;t=1

`q` is the burst (max, rounded down, and at least 1: a bucket whose max is
below 1 still admits what costs less), `w` the seconds to refill all of it
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

from ._bucket import Bucket
from ._decision import Decision, MultiDecision, whole_seconds

__all__ = ["rate_limit_headers"]


def _sf_string(text: str) -> str:
    # Names are printable ASCII (Bucket checks), so escaping is all that's left.
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def quota(bucket: Bucket) -> int:
    """A bucket's burst in whole tokens, as the fields state it: rounded
    down, but never 0 (a bucket of max 0.5 still admits costs up to 0.5)."""
    return max(1, math.floor(bucket.max))


def rate_limit_headers(decision: Union[Decision, MultiDecision], *, legacy: bool = False) -> dict[str, str]:
    """The fields for a response to the request `decision` answered.
    Empty for a degraded or shed decision: Redis said nothing to report."""
    if decision.degraded or decision.shed:
        return {}
    if isinstance(decision, MultiDecision):
        decisions, tightest = decision.decisions, decision.tightest
    else:
        decisions, tightest = (decision,), decision
    policy, current = [], []
    for d in decisions:
        name = _sf_string(d.bucket.name or "default")
        policy.append(f"{name};q={quota(d.bucket)};w={math.ceil(d.bucket.max / d.bucket.rate)}")
        current.append(f"{name};r={max(d.remaining, 0)};t={whole_seconds(d.wait_ms)}")
    headers = {"RateLimit-Policy": ", ".join(policy), "RateLimit": ", ".join(current)}
    if legacy:
        headers["X-RateLimit-Limit"] = str(quota(tightest.bucket))
        headers["X-RateLimit-Remaining"] = str(max(tightest.remaining, 0))
    if not decision.allowed:
        headers["Retry-After"] = str(decision.retry_after)
    return headers
