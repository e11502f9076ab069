"""Which limits a request meets: its identities as LiteLLM names them (the
virtual key's hash, the user, the team, the end user, the model group),
its tier, the limits the rules give each dimension with those LiteLLM
stores on the key, user or team in their place, and the tokens to reserve
for it. Nothing here talks to Redis."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, Optional, Union

from .._bucket import Bucket
from .._lease import Concurrency
from .._quota import Quota
from ._rules import Limits, Rules, per_minute

# LiteLLM's names for the three kinds (its rate_limit_type).
Kind = Literal["requests", "tokens", "max_parallel_requests"]


class BadRequest(ValueError):
    """A request the limits can't be applied to (a 400): says what is wrong."""


@dataclass(frozen=True)
class Limit:
    """One limit a request meets: `dimension` (key, user, team, end_user,
    model: per key and model group; deployment: the model group for all
    callers), its `kind`, the Redis `key` and the rule charged there; a
    calendar budget's `period` ("day", "month", "3600s"), else None."""

    dimension: str
    kind: Kind
    key: str
    rule: Union[Bucket, Quota, Concurrency]
    limit: int
    period: Optional[str] = None

    @property
    def name(self) -> str:
        return f"{self.dimension}:{self.kind}" + (f":{self.period}" if self.period else "")


def hashed(value: str) -> str:
    """A key's identity in Redis: its SHA-256, so no raw key is stored."""
    return hashlib.sha256(value.encode()).hexdigest()


def identities(auth: Any, data: Mapping[str, Any]) -> dict[str, Optional[str]]:
    """Who sent the request: the fields of LiteLLM's UserAPIKeyAuth (the
    end user may also be the request's `user`, as LiteLLM reads it)."""
    key = getattr(auth, "token", None) or getattr(auth, "api_key", None)
    end_user = getattr(auth, "end_user_id", None) or data.get("user")
    return {
        "key": hashed(key) if isinstance(key, str) and key else None,
        "user": _text(getattr(auth, "user_id", None)),
        "team": _text(getattr(auth, "team_id", None)),
        "end_user": _text(end_user),
    }


def _text(value: Any) -> Optional[str]:
    return value if isinstance(value, str) and value else None


def tier_of(auth: Any, rules: Rules) -> str:
    """The tier named in the key's metadata, else in its team's, else
    "default"; a tier the rules don't know is "default" too."""
    for field in ("metadata", "team_metadata"):
        meta = getattr(auth, field, None)
        if isinstance(meta, Mapping):
            tier = meta.get(rules.tier_field)
            if isinstance(tier, str) and tier in rules.tiers:
                return tier
    return "default"


def stored_limits(auth: Any, dimension: str, model: str) -> dict[str, Any]:
    """The limits LiteLLM keeps on the key, its user, team or end user
    (from its database), by our field names."""

    def got(name: str) -> Any:
        return getattr(auth, name, None)

    if dimension == "key":
        return {"rpm": got("rpm_limit"), "tpm": got("tpm_limit"), "parallel": got("max_parallel_requests")}
    if dimension == "user":
        return {"rpm": got("user_rpm_limit"), "tpm": got("user_tpm_limit")}
    if dimension == "team":
        return {"rpm": got("team_rpm_limit"), "tpm": got("team_tpm_limit")}
    if dimension == "end_user":
        return {"rpm": got("end_user_rpm_limit"), "tpm": got("end_user_tpm_limit")}
    # Per key and model: the key's per-model limits, or the older ones in its metadata.
    meta = got("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    rpm = _per_model(got("rpm_limit_per_model"), model) or _per_model(meta.get("model_rpm_limit"), model)
    tpm = _per_model(got("tpm_limit_per_model"), model) or _per_model(meta.get("model_tpm_limit"), model)
    return {"rpm": rpm, "tpm": tpm}


def _per_model(table: Any, model: str) -> Any:
    return table.get(model) if isinstance(table, Mapping) else None


def request_limits(rules: Rules, auth: Any, data: Mapping[str, Any]) -> list[Limit]:
    """Every limit the request meets, in a fixed order (deployment, then
    per key and model, key, team, user, end user). A dimension the request
    has no identity for is skipped, unless the rules require it."""
    model = data.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("the request names no model")
    who = identities(auth, data)
    for dimension in rules.require:
        if who.get(dimension if dimension != "model" else "key") is None:
            raise BadRequest(f"the request has no {dimension}, which the rate limits require")
    tier = tier_of(auth, rules)
    dims = rules.tiers.get(tier, {})
    out: list[Limit] = []
    deployment = rules.models.get(model)
    if deployment is not None:
        out += _limits(rules, "deployment", model, deployment)
    if who["key"] is not None:
        per_model = rules.per_model.get(tier, {}).get(model, Limits()).merged(**stored_limits(auth, "model", model))
        out += _limits(rules, "model", f"{who['key']}:{model}", per_model)
    for dimension in ("key", "team", "user", "end_user"):
        identity = who[dimension]
        if identity is not None:
            own = dims.get(dimension, Limits()).merged(**stored_limits(auth, dimension, model))
            out += _limits(rules, dimension, identity, own)
    return out


def _limits(rules: Rules, dimension: str, identity: str, limits: Limits) -> list[Limit]:
    out: list[Limit] = []
    base = f"{rules.prefix}:{dimension}"
    if limits.rpm is not None:
        name = f"{dimension}:requests"
        out.append(
            Limit(dimension, "requests", f"{base}:requests:{identity}", per_minute(limits.rpm, name), limits.rpm)
        )
    if limits.tpm is not None:
        name = f"{dimension}:tokens"
        out.append(Limit(dimension, "tokens", f"{base}:tokens:{identity}", per_minute(limits.tpm, name), limits.tpm))
    if limits.parallel is not None:
        name = f"{dimension}:max_parallel_requests"
        rule = rules.concurrency(limits.parallel, name)
        out.append(Limit(dimension, "max_parallel_requests", f"{base}:parallel:{identity}", rule, limits.parallel))
    for budget in limits.budgets:
        quota = budget.quota(f"{dimension}:{budget.kind}:{budget.per}")
        # The offset is in the key: a budget whose local midnight moves
        # starts a key of its own rather than reading another's period.
        shift = f"{budget.offset:+d}" if budget.offset else ""
        key = f"{base}:{budget.kind}:{quota.label}{shift}:{identity}"
        out.append(Limit(dimension, budget.kind, key, quota, budget.amount, quota.label))
    return out


def completion_budget(data: Mapping[str, Any], default: int) -> int:
    """The completion tokens to reserve: the request's max_tokens (or
    max_completion_tokens), else the rules' default."""
    for name in ("max_completion_tokens", "max_tokens"):
        value = data.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise BadRequest(f"{name} must be a whole number >= 1, got {value!r}")
        return value
    return default


def prompt_tokens(model: str, data: Mapping[str, Any]) -> int:
    """The prompt's tokens as LiteLLM counts them (litellm.token_counter):
    chat messages, or a completion's prompt, or an embedding's input."""
    # The proxy's own counter; imported here so the rules load without it.
    import litellm  # type: ignore[import-not-found, unused-ignore]

    messages = data.get("messages")
    text = data.get("prompt", data.get("input"))
    try:
        if isinstance(messages, list):
            return int(litellm.token_counter(model=model, messages=messages))
        if isinstance(text, str) or (isinstance(text, list) and all(isinstance(t, str) for t in text)):
            return int(litellm.token_counter(model=model, text=text))
    except Exception:
        # A content LiteLLM can't count (an unknown part type): about four
        # characters a token; settling charges what was really used.
        return len(str(messages if messages is not None else text)) // 4
    return 0
