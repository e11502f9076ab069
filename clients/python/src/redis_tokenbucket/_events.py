"""Decision events: what the `on_decision` hook of a limiter receives, once
per decision, for metrics (docs/failure-model.md, Decision events)."""

from __future__ import annotations

from typing import Literal, NamedTuple

Outcome = Literal["within_limit", "near_limit", "over_limit", "shadow_mode"]

# envoyproxy/ratelimit's NEAR_LIMIT_RATIO default.
DEFAULT_NEAR_LIMIT_RATIO = 0.8


class DecisionEvent(NamedTuple):
    """One decision, as metrics see it.

    - `op`: "consume", "peek", "adjust" or "consume_many";
    - `policy`: the names of the buckets, joined by "," ("" if unnamed);
    - `allowed`, `degraded`, `shed`, `cached`: as on the decision;
    - `backend`: "module", "functions", "eval", "local" (the in-process
      buckets of on_error="local"), or "" when no backend answered (a shed
      call, a policy answer, a cached denial before any call);
    - `latency_s`: seconds the call took, waiting included;
    - `breaker`: the breaker's state after the call: "closed", "open",
      "half_open" ("closed" without a breaker);
    - `outcome`: envoyproxy/ratelimit's names for its stats:
      "over_limit" (denied), "shadow_mode" (a denial shadow mode let
      through), "near_limit" (admitted, and what is used of a bucket, a
      quota or a lease's slots has reached the limiter's
      `near_limit_ratio` of it), else "within_limit" (a degraded admission
      has no numbers to judge: "within_limit");
    - `rule`: the name of the rule that decided ("" if unnamed): the
      denying bucket with the longest wait, else the one with the least
      share left; an acquire's Concurrency when no slot was free.
    """

    op: str
    policy: str
    allowed: bool
    degraded: bool
    shed: bool
    cached: bool
    backend: str
    latency_s: float
    breaker: str
    outcome: Outcome = "within_limit"
    rule: str = ""
