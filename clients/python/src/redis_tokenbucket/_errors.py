"""Exceptions of the package (invalid arguments are `InvalidArgument`, a
ValueError, in _bucket)."""

from __future__ import annotations

from collections.abc import Sequence

from redis.exceptions import ConnectionError as RedisConnectionError


class LimiterError(Exception):
    """Base class of the limiter's own errors."""


class Shed(LimiterError):
    """The call could not get its decision in time for a local reason (no
    free connection within the budget, an event loop too far behind, the
    process out of descriptors or ports): the gateway is overloaded, Redis
    did not fail. Never admitted, never counted by the breaker."""


class NoBackendError(LimiterError):
    """No backend could serve the call: the server has no TB.* commands,
    refuses the Functions library, and refuses EVAL too (or the forced
    backend is refused). `causes` holds each backend's error."""

    def __init__(self, causes: Sequence[tuple[str, BaseException]]) -> None:
        self.causes = tuple(causes)
        detail = "; ".join(f"{name}: {type(exc).__name__}: {exc}" for name, exc in self.causes)
        super().__init__(f"no rate-limit backend answered ({detail})")


class CrossSlotError(LimiterError):
    """`consume_many(..., atomic=True)` on a Redis Cluster with keys in
    more than one hash slot: one atomic call can't reach them all."""


class ReplicasBehind(LimiterError, RedisConnectionError):
    """With `wait_replicas`: a write that admitted was acknowledged by
    fewer replicas than asked within `wait_timeout`. Redis failing, as far
    as the policy and the breaker go (the call gets its `on_error` answer);
    raised under "raise". A redis ConnectionError too, as CircuitOpenError."""


class CircuitOpenError(LimiterError, RedisConnectionError):
    """Raised instead of calling Redis while the circuit breaker is open
    (Redis failed several times lately) and the policy is "raise". A
    redis ConnectionError too, so handlers of Redis being down catch it."""
