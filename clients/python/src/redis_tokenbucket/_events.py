"""Decision events: what the `on_decision` hook of a limiter receives, once
per decision, for metrics (docs/failure-model.md, Decision events)."""

from __future__ import annotations

from typing import NamedTuple


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
      "half_open" ("closed" without a breaker).
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
