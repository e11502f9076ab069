"""Gateway configuration: bucket sizes per tier and dimension, Redis, proxies.

Everything is a pydantic model, so a bad limit fails at startup rather than
as a Redis error on the first request, and tests can inject tiny limits.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Mapping

from pydantic import BaseModel, ConfigDict, Field, IPvAnyNetwork, model_validator
from redis_tokenbucket import Bucket, Concurrency


class TokenBucket(BaseModel):
    """`max` tokens of burst, refilled at `rate` tokens per second, as the
    configuration spells it. Checked by `redis_tokenbucket.Bucket`, with the
    module's own rules (docs/commands.md, Limits)."""

    model_config = ConfigDict(frozen=True)

    max: float
    rate: float

    @model_validator(mode="after")
    def _valid(self) -> TokenBucket:
        Bucket(self.max, self.rate)  # raises a ValueError naming the field
        return self

    def named(self, name: str) -> Bucket:
        """The package's Bucket, under the policy name the headers show."""
        return Bucket(self.max, self.rate, name)


class TierLimits(BaseModel):
    """The buckets of one tier: requests per user and per API key, and the
    LLM token budget per user (in tokens, not requests); and `streams`, the
    streamed chats a user may have in flight at once."""

    model_config = ConfigDict(frozen=True)

    user: TokenBucket
    key: TokenBucket
    llm: TokenBucket
    streams: int = 2

    @model_validator(mode="after")
    def _valid_streams(self) -> TierLimits:
        Concurrency(self.streams, 1)  # raises a ValueError naming `limit`
        return self


class Limits(BaseModel):
    model_config = ConfigDict(frozen=True)

    tiers: dict[str, TierLimits] = {
        "free": TierLimits(
            user=TokenBucket(max=10, rate=0.17),
            key=TokenBucket(max=10, rate=0.17),
            llm=TokenBucket(max=20_000, rate=10),
            streams=2,
        ),
        "standard": TierLimits(
            user=TokenBucket(max=60, rate=1),
            key=TokenBucket(max=60, rate=1),
            llm=TokenBucket(max=200_000, rate=100),
            streams=8,
        ),
        "enterprise": TierLimits(
            # An enterprise account spreads load over several keys.
            user=TokenBucket(max=3000, rate=50),
            key=TokenBucket(max=1500, rate=25),
            llm=TokenBucket(max=2_000_000, rate=1000),
            streams=64,
        ),
    }
    # One IP bucket for everybody, not per tier: `rl:ip:<addr>` is shared by
    # every caller behind that address (NAT, an office), whatever their
    # tiers, and the bucket clamps its balance to the `max` of each call, so
    # per-tier sizes on one key would let free callers shrink it for
    # enterprise ones. It is a flood guard, so it must admit one enterprise
    # key at full speed.
    ip: TokenBucket = TokenBucket(max=600, rate=30)
    # How long a streamed chat's slot lives without a renewal (ms). The
    # gateway renews it about every third of that while the stream runs; a
    # gateway that dies frees its slots this long after its last renewal.
    stream_lease_ms: int = 30_000
    # Streamed chats in flight across the whole deployment, every user and
    # every gateway process: what the model backend serves at once. Each
    # stream takes one of these and one of its user's `streams`. Size it to
    # the backend's concurrent generations (GPU replicas x their batch), so
    # that a burst of users waits with a 429 here rather than in the
    # backend's queue; see the README.
    model_streams: int = 1000

    @model_validator(mode="after")
    def _has_free(self) -> Limits:
        if "free" not in self.tiers:
            raise ValueError("tiers must define 'free', the fallback tier")
        Concurrency(1, self.stream_lease_ms)  # raises a ValueError naming `lease_ms`
        self.deployment_streams()  # raises a ValueError naming `limit`
        return self

    def for_tier(self, tier: str | None) -> TierLimits:
        """A missing or unknown tier gets the free limits, never none."""
        return self.tiers.get(tier or "free", self.tiers["free"])

    def streams(self, tier: str | None) -> Concurrency:
        """The tier's limit of streamed chats in flight, per user."""
        return Concurrency(self.for_tier(tier).streams, self.stream_lease_ms, name="streams")

    def deployment_streams(self) -> Concurrency:
        """The limit of streamed chats in flight across the deployment."""
        return Concurrency(self.model_streams, self.stream_lease_ms, name="model_streams")


class Principal(BaseModel):
    """Who an API key belongs to, as the auth system reports it. The tier is
    a plain string: the auth system may know tiers this gateway does not."""

    user_id: str = Field(min_length=1)
    tier: str | None = None


def key_id(api_key: str) -> str:
    """SHA-256 of an API key: what the gateway stores and logs instead of the
    key. A high-entropy key can't be recovered from it."""
    return hashlib.sha256(api_key.encode()).hexdigest()


# `uvicorn app:app` works out of the box with these; set GATEWAY_API_KEYS
# for anything real.
DEMO_API_KEYS = {
    key_id("demo-free"): Principal(user_id="alice", tier="free"),
    key_id("demo-standard"): Principal(user_id="bob", tier="standard"),
    key_id("demo-enterprise"): Principal(user_id="carol", tier="enterprise"),
}


class Settings(BaseModel):
    redis_url: str = "redis://127.0.0.1:6379/0"
    # The limiter's budget for Redis to answer a command, from when it is
    # written, and the connect timeout (s): a hung Redis must not hang
    # requests, the route's fail-open/fail-closed policy takes over instead.
    redis_timeout: float = Field(default=0.1, gt=0)
    # Connections per process (redis-py 6+'s default): the limiter's
    # commands in flight at once, on its one shared connection. A request
    # that finds them all taken waits its turn, unless the oldest waiting
    # has waited redis_timeout already: then it is shed at once (503).
    redis_max_connections: int = Field(default=100, ge=1)
    # Denials each worker remembers until their retry time, answering the
    # same request again from memory (429, no round trip to Redis): a user
    # hammering past its limit costs Redis one call per retry window. 0
    # turns it off. It never denies what Redis would admit (the package's
    # README, "The local denial cache").
    denial_cache: int = Field(default=10_000, ge=0)
    # The circuit breaker: after this many Redis failures within the
    # window (s), routes answer by their policy without trying Redis, and
    # probe it again after the cooldown (s).
    breaker_failures: int = Field(default=5, ge=1)
    breaker_window: float = Field(default=10.0, gt=0)
    breaker_cooldown: float = Field(default=2.0, gt=0)
    # A Redis Cluster: a cluster client (unless one is injected), and the
    # buckets checked one by one (TB.CONSUME, refunds with TB.ADJUST)
    # instead of one TB.MCONSUME, since they live in different slots.
    cluster_mode: bool = False
    # Peers whose X-Forwarded-For is believed. Empty: the header is ignored.
    trusted_proxies: list[IPvAnyNetwork] = []
    limits: Limits = Limits()
    # The stub model's pause before each token (ms), so that streams stay
    # open long enough to be seen (tests, demos). 0: as fast as it can.
    stub_token_delay_ms: int = Field(default=0, ge=0)
    # SHA-256 of the API key (see key_id) -> principal; raw keys are never kept.
    api_keys: dict[str, Principal] = DEMO_API_KEYS

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> Settings:
        """GATEWAY_* variables; JSON for the structured ones."""
        raw: dict[str, object] = {}
        for name in ("redis_url", "redis_timeout", "redis_max_connections", "denial_cache", "cluster_mode",
                     "breaker_failures", "breaker_window", "breaker_cooldown", "stub_token_delay_ms"):  # fmt: skip
            if (value := env.get(f"GATEWAY_{name.upper()}")) is not None:
                raw[name] = value
        if proxies := env.get("GATEWAY_TRUSTED_PROXIES"):
            raw["trusted_proxies"] = [p.strip() for p in proxies.split(",") if p.strip()]
        for name in ("limits", "api_keys"):
            if (value := env.get(f"GATEWAY_{name.upper()}")) is not None:
                raw[name] = json.loads(value)
        return cls.model_validate(raw)
