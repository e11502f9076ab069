"""Configuration validation and defaults (no Redis)."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from redis_tokenbucket import Concurrency

from config import Limits, Settings, TierLimits, TokenBucket, key_id


@pytest.mark.parametrize("max_, rate", [(0, 1), (10, 0), (-1, 1), (10, -0.5), (2e12, 1), (1e11, 1)])
def test_bad_buckets_are_rejected(max_, rate):
    with pytest.raises(ValidationError):
        TokenBucket(max=max_, rate=rate)


def test_defaults_are_the_issue_tiers():
    tiers = Limits().tiers
    assert tiers["free"].user == TokenBucket(max=10, rate=0.17)
    assert tiers["standard"].user == TokenBucket(max=60, rate=1)
    assert tiers["enterprise"].key == TokenBucket(max=1500, rate=25)
    # The shared IP bucket lets one enterprise key through at full speed.
    assert Limits().ip.rate >= tiers["enterprise"].key.rate
    # Streamed chats in flight per user, and their lease.
    assert [tiers[t].streams for t in ("free", "standard", "enterprise")] == [2, 8, 64]
    assert Limits().stream_lease_ms == 30_000
    assert Limits().streams("standard") == Concurrency(8, 30_000, name="streams")
    assert Limits().streams("platinum").limit == 2


@pytest.mark.parametrize(("streams", "lease_ms"), [(0, 1000), (1_000_001, 1000), (2, 0), (2, 86_400_001)])
def test_bad_stream_limits_are_rejected_with_the_modules_message(streams, lease_ms):
    free = {n: {"max": 2, "rate": 0.5} for n in ("user", "key", "llm")}
    with pytest.raises(ValidationError, match="limit must be|lease_ms must be"):
        Limits.model_validate({"tiers": {"free": {**free, "streams": streams}}, "stream_lease_ms": lease_ms})


def test_unknown_or_missing_tier_is_free():
    limits = Limits()
    assert limits.for_tier(None) is limits.tiers["free"]
    assert limits.for_tier("platinum") is limits.tiers["free"]
    assert limits.for_tier("standard") is limits.tiers["standard"]


def test_free_tier_is_required():
    bucket = TokenBucket(max=1, rate=1)
    with pytest.raises(ValidationError):
        Limits(tiers={"pro": TierLimits(user=bucket, key=bucket, llm=bucket)})


def test_settings_from_env():
    free = {n: {"max": 2, "rate": 0.5} for n in ("user", "key", "llm")}
    limits = {"tiers": {"free": free}, "ip": {"max": 9, "rate": 3}}
    settings = Settings.from_env({
        "GATEWAY_REDIS_URL": "redis://cache:6380/1",
        "GATEWAY_CLUSTER_MODE": "true",
        "GATEWAY_TRUSTED_PROXIES": "10.0.0.0/8, 192.0.2.1",
        "GATEWAY_LIMITS": json.dumps(limits),
        "GATEWAY_API_KEYS": json.dumps({key_id("s3cret"): {"user_id": "dora", "tier": "standard"}}),
        "GATEWAY_STUB_TOKEN_DELAY_MS": "25",
    })
    assert settings.redis_url == "redis://cache:6380/1" and settings.cluster_mode
    assert [str(n) for n in settings.trusted_proxies] == ["10.0.0.0/8", "192.0.2.1/32"]
    assert settings.limits.ip == TokenBucket(max=9, rate=3)
    assert settings.api_keys[key_id("s3cret")].user_id == "dora"
    assert settings.stub_token_delay_ms == 25 and Settings().stub_token_delay_ms == 0


def test_bad_env_fails_at_startup():
    with pytest.raises(ValidationError):
        Settings.from_env({"GATEWAY_LIMITS": json.dumps({"ip": {"max": 0, "rate": 1}})})
