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

A Lease's Concurrency is a policy of the draft's quota unit
"concurrent-requests", with no window::

    RateLimit-Policy: "streams";q=8;qu="concurrent-requests", "user";q=10;w=59
    RateLimit: "streams";r=6, "user";r=9;t=6

`q` is the limit, `r` the slots left after the call, and `t` (only when
no slot is free) the seconds until one is, rounded up.

A Quota's policy is named after its period unless it has a name ("day",
"month", "3600s"): `q` is its limit, `w` the length of the current
period (a month's or year's own number of days), `t` the seconds until
it resets::

    RateLimit-Policy: "month";q=1000000;w=2678400
    RateLimit: "month";r=999000;t=86400
"""

from __future__ import annotations

import math
import time
from typing import Union

from ._decision import Decision, MultiDecision, whole_seconds
from ._lease import Lease
from ._quota import Quota, Rule

__all__ = ["rate_limit_headers"]


def _sf_string(text: str) -> str:
    # Names are printable ASCII (Bucket checks), so escaping is all that's left.
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def quota(bucket: Rule) -> int:
    """A bucket's burst (a quota's limit) in whole tokens, as the fields
    state it: rounded down, but never 0 (a bucket of max 0.5 still admits
    costs up to 0.5)."""
    return max(1, math.floor(bucket.max))


def rate_limit_headers(decision: Union[Decision, MultiDecision, Lease], *, legacy: bool = False) -> dict[str, str]:
    """The fields for a response to the request `decision` answered: a
    Decision, a MultiDecision, or a Lease (its Concurrency first, then its
    buckets). Empty for a degraded or shed decision: Redis said nothing to
    report."""
    if decision.degraded or decision.shed:
        return {}
    if isinstance(decision, MultiDecision) and not decision.decisions:
        return {}  # every rule was skipped: no policy applied
    policy: list[str] = []
    current: list[str] = []
    limit_remaining: tuple[int, int]
    if isinstance(decision, Lease):
        c = decision.concurrency
        name = _sf_string(c.name or "default")
        policy.append(f'{name};q={c.limit};qu="concurrent-requests"')
        # `t` only when the slots are what it waits for: a slot has no reset time.
        current.append(f"{name};r={decision.remaining}" + (f";t={decision.retry_after}" if decision.busy else ""))
        decisions, allowed = decision.decisions, decision.acquired
        if decision.busy or not decisions:
            limit_remaining = (c.limit, decision.remaining)
        else:
            limit_remaining = _legacy(MultiDecision(allowed, decision.retry_after_ms, decisions).tightest)
    elif isinstance(decision, MultiDecision):
        decisions, allowed = decision.decisions, decision.allowed
        limit_remaining = _legacy(decision.tightest)
    else:
        decisions, allowed = (decision,), decision.allowed
        limit_remaining = _legacy(decision)
    for d in decisions:
        rule = d.bucket
        if isinstance(rule, Quota):
            name = _sf_string(rule.name or rule.label)
            window = rule.period_seconds(time.time() + d.reset_after_ms / 1000)
        else:
            name = _sf_string(rule.name or "default")
            window = math.ceil(rule.max / rule.rate)
        policy.append(f"{name};q={quota(rule)};w={window}")
        current.append(f"{name};r={max(d.remaining, 0)};t={whole_seconds(d.wait_ms)}")
    headers = {"RateLimit-Policy": ", ".join(policy), "RateLimit": ", ".join(current)}
    if legacy:
        headers["X-RateLimit-Limit"] = str(limit_remaining[0])
        headers["X-RateLimit-Remaining"] = str(limit_remaining[1])
    if not allowed:
        headers["Retry-After"] = str(decision.retry_after)
    return headers


def _legacy(tightest: Decision) -> tuple[int, int]:
    return quota(tightest.bucket), max(tightest.remaining, 0)
