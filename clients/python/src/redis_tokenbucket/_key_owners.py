"""Which rule writes which Redis keys, per limiter: two rules with other
limits must never share keys unless asked to.

A rule writes `prefix:name:<identity>`: the policy's name is part of the
key. Two rules on one limiter that spell the same `prefix:name` with other
limits (a global "ip" of 100 a minute, a login "ip" of 2) would charge
each other's buckets, and a bucket clamps its balance to the `max` of each
call. So a rule claims its `prefix:name` when it is put to use (at a
dependency's or a middleware's construction; a rule whose limit is a
function of the request, at its first request), and a claim by another
rule with other limits is refused, naming both. Rules with the same
limits may share keys (one policy, used in two places); one rule whose
bucket is a function of the request may give them several limits (a
caller's tier: that is what it asks for).
"""

from __future__ import annotations

import weakref
from typing import Any, NamedTuple, Optional

Limits = Optional[tuple[Any, ...]]
"""A static rule's ("bucket", max, rate), ("quota", limit, period, offset)
or ("lease", limit, lease_ms); None for a rule whose limits are a
function of the request."""


class _Owner(NamedTuple):
    rule: Any
    limits: Limits


_OWNERS: weakref.WeakKeyDictionary[Any, dict[tuple[str, str], _Owner]] = weakref.WeakKeyDictionary()


def claim(limiter: Any, rule: Any, prefix: str, name: str, limits: Limits) -> None:
    """Claims `prefix:name:*` on `limiter`'s Redis for `rule`; ValueError if
    another rule with other limits claimed it."""
    owners = _OWNERS.setdefault(limiter, {})
    owner = owners.get((prefix, name))
    if owner is None:
        owners[prefix, name] = _Owner(rule, limits)
        return
    if owner.rule == rule or (limits is not None and owner.limits == limits):
        return
    raise ValueError(
        f"two rules on one limiter would write the same Redis keys {prefix}:{name}:<identity> with other limits "
        f"({_describe(owner)}, and {_describe(_Owner(rule, limits))}): the policy's name is part of the key. "
        f"Give one of them another name, or another prefix (prefix={prefix + ':login'!r}, say)"
    )


def _describe(owner: _Owner) -> str:
    if owner.limits is None:
        return "one whose limit is a function of the request"
    kind, a, b, *more = owner.limits
    if kind == "quota":
        return f"Quota(limit={a:g}, period={b!r}, offset={more[0]})"
    return f"Bucket(max={a:g}, rate={b:g})" if kind == "bucket" else f"Concurrency(limit={a}, lease_ms={b})"
