"""Prometheus metrics for the redis-tokenbucket Python package, with
prometheus_client: its limiters' decisions (the `on_decision` hook) by
operation, policy and outcome, their latency as a histogram, and each
watched limiter's breaker state and leases held, read at every scrape.

How to use it, the series and their labels: contrib/prometheus/README.md,
"The Python package". Every label takes few values (operation, bucket
names, outcome, backend, the names given to `watch`): never a key or a
lease id.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram
from redis_tokenbucket import DecisionEvent

OUTCOMES = ("admitted", "denied", "shadow_denied", "cached_denial", "degraded_admitted", "degraded_denied", "shed")
BREAKER_STATES = ("closed", "open", "half_open")
# Seconds. A decision takes well under a millisecond on a local network; a
# call's budget is the limiter's timeout (0.1 s by default; up to 1 s while
# it finds the backend), and a shed call waited that long for a connection.
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
# The `backend` label when no backend answered: a policy answer while Redis
# failed, a shed call, a cached denial before any call.
NO_BACKEND = "none"


def outcome(event: DecisionEvent) -> str:
    """One of OUTCOMES: what the caller was told, and on whose word."""
    if event.shed:
        return "shed"  # this process was too busy to get Redis's answer
    if event.outcome == "shadow_mode":
        return "shadow_denied"  # a denial that shadow mode let through
    if event.cached:
        return "cached_denial"  # the local denial cache answered
    if event.degraded:
        return "degraded_admitted" if event.allowed else "degraded_denied"
    return "admitted" if event.allowed else "denied"


class Watched(Protocol):
    """What `watch` reads of a limiter (sync or asyncio) at each scrape."""

    @property
    def leases_held(self) -> int: ...

    @property
    def breaker_state(self) -> str: ...


class TokenBucketMetrics:
    """The metrics, in `registry` (prometheus_client's default one unless
    given). One per registry: a second in the same registry is refused by
    prometheus_client (the names are taken)."""

    def __init__(
        self, registry: CollectorRegistry = REGISTRY, latency_buckets: Sequence[float] = LATENCY_BUCKETS
    ) -> None:
        self.decisions = Counter(
            "redis_tokenbucket_decisions",
            "Rate-limit decisions of redis-tokenbucket limiters in this process, by operation, "
            "policy (the bucket names, an acquire's concurrency name first) and outcome.",
            ["op", "policy", "outcome"],
            registry=registry,
        )
        self.latency = Histogram(
            "redis_tokenbucket_decision_duration_seconds",
            "Time a decision took, waiting for a connection included, by operation and backend "
            f'("{NO_BACKEND}": no backend answered).',
            ["op", "backend"],
            buckets=tuple(latency_buckets),
            registry=registry,
        )
        self.breaker = Gauge(
            "redis_tokenbucket_breaker_state",
            "1 for the state the watched limiter's circuit breaker is in (closed, open, half_open), else 0.",
            ["limiter", "state"],
            registry=registry,
        )
        self.leases = Gauge(
            "redis_tokenbucket_leases_held",
            "Concurrency leases the watched limiter holds now (acquired, not released or lost).",
            ["limiter"],
            registry=registry,
        )
        self._watched: dict[str, Watched] = {}

    def on_decision(self, event: DecisionEvent) -> None:
        """The limiter's hook: `Limiter(client, on_decision=metrics.on_decision)`."""
        self.decisions.labels(event.op, event.policy, outcome(event)).inc()
        self.latency.labels(event.op, event.backend or NO_BACKEND).observe(event.latency_s)

    def watch(self, limiter: Watched, name: str = "default") -> None:
        """Exports `limiter`'s leases held and breaker state under
        `limiter=name`, read at each scrape. One name per limiter."""
        if not name:
            raise ValueError("name must be a non-empty string (it is the limiter label)")
        if name in self._watched:
            raise ValueError(f"a limiter is already watched as {name!r}: give each limiter its own name")
        self._watched[name] = limiter
        self.leases.labels(name).set_function(lambda: limiter.leases_held)
        for state in BREAKER_STATES:
            self.breaker.labels(name, state).set_function(_is_in(limiter, state))


def _is_in(limiter: Watched, state: str) -> Callable[[], float]:
    """1.0 while the limiter's breaker is in `state`, read when called."""
    return lambda: float(limiter.breaker_state == state)
