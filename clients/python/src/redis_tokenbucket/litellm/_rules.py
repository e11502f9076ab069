"""The LiteLLM hook's rules: which limits apply to whom, and how the hook
reaches Redis. Read from a YAML file (or a mapping, the `redis_tokenbucket`
section of the proxy's config.yaml) and checked whole when the proxy
starts: a bad rule is refused with the file, the field and the reason,
never found by the first request it would have limited."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Optional, Union

import yaml  # type: ignore[import-untyped, unused-ignore]

from .._bucket import Bucket
from .._lease import Concurrency
from .._quota import Quota
from .._requests import OnError

# The dimensions a tier limits, as LiteLLM names what they identify: the
# virtual key (by its hash), the key's user and team, the end user (the
# request's `user`), and the model group per key.
DIMENSIONS = ("key", "user", "team", "end_user", "model")
LIMIT_FIELDS = ("rpm", "tpm", "parallel", "budgets")
# A budget: requests or tokens per calendar period (a quota), as
# `{tokens: 1000000, per: month, offset: 60}`.
BUDGET_FIELDS = ("requests", "tokens", "per", "offset")
ON_ERROR = ("open", "closed", "local")
TOP_FIELDS = (
    "redis_url",
    "on_error",
    "processes",
    "timeout",
    "prefix",
    "default_max_tokens",
    "lease_ms",
    "max_request_s",
    "max_delay",
    "tier_field",
    "require",
    "tiers",
    "models",
)


class RulesError(ValueError):
    """A rules file that can't be used: names the file, the field and why."""


@dataclass(frozen=True)
class Budget:
    """`amount` requests or tokens per calendar period: a Quota, whose use
    resets at the period's start (`per`: day, week, month, year, or whole
    seconds from the epoch; `offset`: minutes ahead of UTC)."""

    kind: Literal["requests", "tokens"]
    amount: int
    per: Union[str, int]
    offset: int = 0

    def quota(self, name: str) -> Quota:
        return Quota(self.amount, self.per, self.offset, name=name)


@dataclass(frozen=True)
class Limits:
    """What one dimension may spend: requests a minute, tokens a minute
    (each a token bucket: a burst of the whole minute's worth, refilled
    evenly), requests in flight (a lease each), and budgets per calendar
    period. None is no limit."""

    rpm: Optional[int] = None
    tpm: Optional[int] = None
    parallel: Optional[int] = None
    budgets: tuple[Budget, ...] = ()

    def merged(self, rpm: Any = None, tpm: Any = None, parallel: Any = None) -> Limits:
        """These limits with the ones LiteLLM stores on a key, user or team
        taking their place where set (an int >= 1; anything else is ignored,
        as LiteLLM ignores it). LiteLLM stores no calendar budgets: the
        rules' stay."""
        rpm, tpm = _stored(rpm, self.rpm), _stored(tpm, self.tpm)
        return Limits(rpm, tpm, _stored(parallel, self.parallel), self.budgets)


def _stored(value: Any, default: Optional[int]) -> Optional[int]:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    return default


def per_minute(limit: int, name: str) -> Bucket:
    """`limit` a minute as a bucket: all of it at once, then limit/60 a second."""
    return Bucket(limit, limit / 60, name=name)


@dataclass(frozen=True)
class Rules:
    """The hook's configuration, checked."""

    redis_url: str = "redis://127.0.0.1:6379/0"
    on_error: OnError = "open"
    processes: int = 1
    timeout: Optional[float] = 0.1
    prefix: str = "llm"
    # Tokens reserved for the completion when a request names no max_tokens.
    default_max_tokens: int = 1024
    lease_ms: int = 30_000
    # A request not settled by then (a hook LiteLLM never called) has its
    # slots released; its reservation stays charged.
    max_request_s: float = 600.0
    # Seconds a request over its buckets may wait its turn (a reservation)
    # instead of a 429; None: refused at once.
    max_delay: Optional[float] = None
    tier_field: str = "tier"
    require: tuple[str, ...] = ()
    tiers: Mapping[str, Mapping[str, Limits]] = field(default_factory=dict)
    # Per tier, per key and model group: {tier: {model group: limits}}.
    per_model: Mapping[str, Mapping[str, Limits]] = field(default_factory=dict)
    models: Mapping[str, Limits] = field(default_factory=dict)

    def concurrency(self, limit: int, name: str) -> Concurrency:
        return Concurrency(limit, self.lease_ms, name=name)


def load(path: str) -> Rules:
    """The rules in the YAML file at `path`."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise RulesError(f"{path}: can't read the rules file: {exc.strerror or exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise RulesError(f"{path}: not YAML: {exc}") from None
    return parse(data, path)


def parse(data: Any, source: str) -> Rules:
    """Rules from a mapping (a parsed file, or a section of config.yaml);
    `source` names it in errors."""
    if not isinstance(data, Mapping):
        raise RulesError(f"{source}: the rules must be a mapping, got {type(data).__name__}")
    unknown = sorted(set(map(str, data)) - set(TOP_FIELDS))
    if unknown:
        raise RulesError(f"{source}: unknown field {unknown[0]!r} (fields: {', '.join(TOP_FIELDS)})")
    defaults = Rules()
    on_error = data.get("on_error", defaults.on_error)
    if on_error not in ON_ERROR:
        raise RulesError(f"{source}: on_error must be one of {', '.join(ON_ERROR)}, got {on_error!r}")
    require = data.get("require", [])
    if not isinstance(require, list) or any(r not in DIMENSIONS for r in require):
        raise RulesError(f"{source}: require must be a list of {', '.join(DIMENSIONS)}, got {require!r}")
    tiers_in = data.get("tiers", {})
    if not isinstance(tiers_in, Mapping):
        raise RulesError(f"{source}: tiers must be a mapping of tier names to limits")
    tiers: dict[str, dict[str, Limits]] = {}
    per_model: dict[str, dict[str, Limits]] = {}
    for tier, dims in tiers_in.items():
        where = f"{source}: tiers.{tier}"
        if not isinstance(dims, Mapping):
            raise RulesError(f"{where}: must be a mapping of {', '.join(DIMENSIONS)} to limits")
        tiers[str(tier)] = {}
        for dim, spec in dims.items():
            if dim not in DIMENSIONS:
                raise RulesError(f"{where}: unknown dimension {dim!r} (dimensions: {', '.join(DIMENSIONS)})")
            if dim == "model":
                # Per key and model group: {model group: limits}.
                if not isinstance(spec, Mapping):
                    raise RulesError(f"{where}.model: must map model groups to limits")
                per_model[str(tier)] = {str(m): limits(s, f"{where}.model.{m}") for m, s in spec.items()}
            else:
                tiers[str(tier)][dim] = limits(spec, f"{where}.{dim}")
    models_in = data.get("models", {})
    if not isinstance(models_in, Mapping):
        raise RulesError(f"{source}: models must map model groups to limits")
    models = {str(m): limits(s, f"{source}: models.{m}") for m, s in models_in.items()}
    rules = Rules(
        redis_url=text(data, "redis_url", source, default_redis_url()),
        on_error=on_error,
        processes=integer(data, "processes", source, defaults.processes),
        timeout=seconds(data, "timeout", source, defaults.timeout, optional=True),
        prefix=text(data, "prefix", source, defaults.prefix),
        default_max_tokens=integer(data, "default_max_tokens", source, defaults.default_max_tokens),
        lease_ms=integer(data, "lease_ms", source, defaults.lease_ms),
        max_request_s=seconds(data, "max_request_s", source, defaults.max_request_s) or defaults.max_request_s,
        max_delay=seconds(data, "max_delay", source, None, optional=True),
        tier_field=text(data, "tier_field", source, defaults.tier_field),
        require=tuple(require),
        tiers=tiers,
        per_model=per_model,
        models=models,
    )
    check_buildable(rules, source)
    return rules


def limits(spec: Any, where: str) -> Limits:
    if not isinstance(spec, Mapping):
        raise RulesError(f"{where}: must be a mapping of {', '.join(LIMIT_FIELDS)}, got {spec!r}")
    unknown = sorted(set(map(str, spec)) - set(LIMIT_FIELDS))
    if unknown:
        raise RulesError(f"{where}: unknown limit {unknown[0]!r} (limits: {', '.join(LIMIT_FIELDS)})")
    got = {name: integer(spec, name, where, None) for name in ("rpm", "tpm", "parallel")}
    return Limits(**got, budgets=budgets(spec.get("budgets", []), f"{where}.budgets"))


def budgets(spec: Any, where: str) -> tuple[Budget, ...]:
    """`[{tokens: N, per: month}, {requests: N, per: day, offset: 60}]`,
    each checked as the Quota it becomes."""
    if not isinstance(spec, list):
        raise RulesError(f"{where}: must be a list of budgets like {{tokens: 1000000, per: month}}, got {spec!r}")
    out: list[Budget] = []
    for i, item in enumerate(spec):
        at = f"{where}[{i}]"
        if not isinstance(item, Mapping):
            raise RulesError(f"{at}: must be a mapping like {{tokens: 1000000, per: month}}, got {item!r}")
        unknown = sorted(set(map(str, item)) - set(BUDGET_FIELDS))
        if unknown:
            raise RulesError(f"{at}: unknown field {unknown[0]!r} (fields: {', '.join(BUDGET_FIELDS)})")
        kinds = [k for k in ("requests", "tokens") if k in item]
        if len(kinds) != 1:
            raise RulesError(f"{at}: give one of requests or tokens, got {item!r}")
        kind: Literal["requests", "tokens"] = "requests" if kinds[0] == "requests" else "tokens"
        if "per" not in item:
            raise RulesError(f"{at}: per is missing (day, week, month, year or seconds)")
        budget = Budget(kind, integer(item, kind, at, None), item["per"], item.get("offset", 0))
        try:
            quota = budget.quota("check")
        except ValueError as exc:
            raise RulesError(f"{at}: {exc}") from None
        # The checked period ("day" for "DAY"); one budget per kind and period.
        budget = Budget(kind, budget.amount, quota.period, quota.offset)
        if any(b.kind == kind and b.per == budget.per for b in out):
            raise RulesError(f"{at}: a second {kind} budget per {quota.label}")
        out.append(budget)
    return tuple(out)


def integer(data: Mapping[str, Any], name: str, where: str, default: Optional[int]) -> Any:
    value = data.get(name, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise RulesError(f"{where}: {name} must be a whole number >= 1, got {value!r}")
    return value


def seconds(
    data: Mapping[str, Any], name: str, where: str, default: Optional[float], *, optional: bool = False
) -> Optional[float]:
    value = data.get(name, default)
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise RulesError(f"{where}: {name} must be a number of seconds > 0, got {value!r}")
    return float(value)


def text(data: Mapping[str, Any], name: str, where: str, default: str) -> str:
    value = data.get(name, default)
    if not isinstance(value, str) or not value:
        raise RulesError(f"{where}: {name} must be a non-empty string, got {value!r}")
    return value


def check_buildable(rules: Rules, source: str) -> None:
    """Every limit makes a valid Bucket and Concurrency (the module's
    bounds), so no request can fail on a rule."""
    every = [(f"tiers.{t}.{d}", lim) for t, dims in rules.tiers.items() for d, lim in dims.items()]
    every += [(f"tiers.{t}.model.{m}", lim) for t, per in rules.per_model.items() for m, lim in per.items()]
    every += [(f"models.{m}", lim) for m, lim in rules.models.items()]
    for where, lim in every:
        try:
            for value in (lim.rpm, lim.tpm):
                if value is not None:
                    per_minute(value, "check")
            if lim.parallel is not None:
                rules.concurrency(lim.parallel, "check")
        except ValueError as exc:
            raise RulesError(f"{source}: {where}: {exc}") from None
    try:
        Concurrency(1, rules.lease_ms)
    except ValueError as exc:
        raise RulesError(f"{source}: lease_ms: {exc}") from None


def default_redis_url() -> str:
    """Where Redis is when the rules don't say: REDIS_URL, else LiteLLM's
    own REDIS_HOST / REDIS_PORT / REDIS_PASSWORD, else localhost."""
    url = os.environ.get("REDIS_URL")
    if url:
        return url
    host = os.environ.get("REDIS_HOST")
    if not host:
        return Rules.redis_url
    port = os.environ.get("REDIS_PORT", "6379")
    password = os.environ.get("REDIS_PASSWORD")
    auth = f":{password}@" if password else ""
    return f"redis://{auth}{host}:{port}/0"
