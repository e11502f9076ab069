"""Atomic token-bucket rate limiting on Redis.

    from redis_tokenbucket import Bucket, Limiter
    lim = Limiter(redis.Redis())
    d = lim.consume("rl:user:42", Bucket(max=10, rate=0.17))

Uses the TB.* module where the server has it, else the Lua library that
ships inside this package (Functions, or the EVAL script), with the same
replies on the same keys. ``redis_tokenbucket.asyncio.Limiter`` is the
awaitable twin; ``redis_tokenbucket.fastapi`` plugs it into FastAPI.
"""

from __future__ import annotations

from ._breaker import Breaker
from ._bucket import Bucket, InvalidArgument, KeyT
from ._cache import DenialCache
from ._decision import Decision, MultiDecision
from ._engine import BackendName
from ._errors import CircuitOpenError, CrossSlotError, LimiterError, NoBackendError, ReplicasBehind
from ._events import DecisionEvent
from ._keys import hash_tagged
from ._lease import Busy, Concurrency, Lease
from ._quota import Quota, Rule
from ._requests import OnError
from ._sync import Limiter
from .headers import rate_limit_headers

__all__ = [
    "BackendName",
    "Breaker",
    "Bucket",
    "Busy",
    "CircuitOpenError",
    "Concurrency",
    "CrossSlotError",
    "Decision",
    "DecisionEvent",
    "DenialCache",
    "InvalidArgument",
    "KeyT",
    "Lease",
    "Limiter",
    "LimiterError",
    "MultiDecision",
    "NoBackendError",
    "OnError",
    "Quota",
    "ReplicasBehind",
    "Rule",
    "hash_tagged",
    "rate_limit_headers",
]
