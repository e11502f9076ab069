"""What the HTTP helpers share, whatever the framework (docs/failure-model.md,
HTTP answers), written once: the answer to a refused request, the client's
address behind trusted proxies, and the fields of stacked limiters merged.

    admitted                 the route's status, RateLimit and RateLimit-Policy
    denied by a bucket       429, the fields, Retry-After, a problem+json body
    shed (local overload)    503, Retry-After
    degraded, "closed"       503, Retry-After: 1
    degraded, "open"         the route's status, no fields
    degraded, "local"        the route's, or 429 with Retry-After from the local bucket

`fastapi` adapts it to Starlette. The Node package's twin is http.ts.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Optional, Protocol, Union

from ._decision import MultiDecision
from ._lease import Lease
from .headers import rate_limit_headers

QUOTA_EXCEEDED = "https://iana.org/assignments/http-problem-types#quota-exceeded"
PROBLEM_JSON = "application/problem+json"

IPAddress = Union[ipaddress.IPv4Address, ipaddress.IPv6Address]
IPNetwork = Union[ipaddress.IPv4Network, ipaddress.IPv6Network]


@dataclass(frozen=True)
class Refusal:
    """A refused request's answer: its status, header fields and
    problem+json body."""

    status: int
    headers: dict[str, str]
    body: dict[str, Any]


def refusal_of(decision: Union[MultiDecision, Lease], *, legacy_headers: bool = False) -> Refusal:
    """The refusal for a denial. A bucket's (Redis's, or the in-process one
    of on_error="local"): a 429 with the RateLimit fields, Retry-After, and
    a problem+json body naming the policies that refused (the buckets that
    could not pay, and a Lease's Concurrency when no slot was free). A
    denial nothing counted, shed or Redis failing under "closed", has no
    wait to tell: a 503 with Retry-After (`unavailable`), never a 429 with
    "retry now"."""
    if not counted(decision):
        return unavailable(decision)
    violated = [d.bucket.name or "default" for d in decision.denied_by]
    if isinstance(decision, Lease) and (decision.busy or not violated):
        violated.insert(0, decision.concurrency.name or "default")
    body = {
        "type": QUOTA_EXCEEDED,
        "title": "Request cannot be satisfied as assigned quota has been exceeded",
        "status": 429,
        "detail": f"Rate limited by {', '.join(violated)}: retry in {decision.retry_after} s.",
        "violated-policies": violated,
    }
    headers = rate_limit_headers(decision, legacy=legacy_headers)
    # A degraded denial (on_error="local") has no RateLimit fields, but its wait.
    headers.setdefault("Retry-After", str(decision.retry_after))
    return Refusal(429, headers, body)


def counted(decision: Union[MultiDecision, Lease]) -> bool:
    """Whether a bucket (or a lease's slots) decided it: not shed, not the
    failure policy's answer (a degraded denial without a wait)."""
    return not (decision.shed or (decision.degraded and decision.retry_after_ms == 0))


def unavailable(decision: Union[MultiDecision, Lease, None] = None) -> Refusal:
    """The 503 of a fail-closed limiter whose Redis could not answer, or of
    a shed decision (this process too busy to get Redis's answer in time),
    with Retry-After."""
    shed = decision is not None and decision.shed
    body = {
        "type": "about:blank",
        "title": "Service Unavailable",
        "status": 503,
        "detail": "The server is overloaded." if shed else "The rate limiter is unavailable.",
    }
    retry = decision.retry_after if decision is not None and decision.retry_after > 0 else 1
    return Refusal(503, {"Retry-After": str(retry)}, body)


# ---- the client's address ---------------------------------------------------------


def trusted_networks(trusted_proxies: Iterable[Union[str, IPNetwork]]) -> tuple[IPNetwork, ...]:
    return tuple(ipaddress.ip_network(n, strict=False) if isinstance(n, str) else n for n in trusted_proxies)


def client_address(peer: str, forwarded_for: Sequence[str], trusted: Sequence[IPNetwork]) -> str:
    """The client's address: the socket `peer`, unless the peer is a
    trusted proxy, in which case X-Forwarded-For (each of its header lines,
    in order) is walked from the right to the first untrusted hop. A
    malformed hop ends the walk at the proxy that passed it on. IPv6
    clients count per /64; IPv4-mapped addresses count as IPv4."""
    addr = parse_ip(peer)
    if addr is None:
        return peer or "unknown"
    hops = ",".join(forwarded_for).split(",")
    for hop in reversed(hops):
        if not any(addr in net for net in trusted):
            break
        previous = parse_ip(hop)
        if previous is None:
            break
        addr = previous
    if isinstance(addr, ipaddress.IPv6Address):
        return str(ipaddress.IPv6Network((addr, 64), strict=False))
    return str(addr)


def parse_ip(text: str) -> Optional[IPAddress]:
    try:
        addr = ipaddress.ip_address(text.strip())
    except ValueError:
        return None
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped:
        return addr.ipv4_mapped
    return addr


# ---- fields of stacked limiters ---------------------------------------------------


class Fields(Protocol):
    """Header fields being chosen for a response: a dict, or a framework's
    mutable headers."""

    def get(self, key: str) -> Optional[str]: ...

    def __setitem__(self, key: str, value: str) -> None: ...


_LISTS = ("ratelimit", "ratelimit-policy")


def add_fields(chosen: Fields, fields: dict[str, str]) -> None:
    """Adds one limiter's fields to those others chose for the same
    response (stacked dependencies and middlewares): every policy that
    applied is in the RateLimit lists; of the legacy pair, the one with
    fewer left; of two waits, the longer."""
    for name, value in fields.items():
        current = chosen.get(name)
        key = name.lower()
        if not current:
            chosen[name] = value
        elif key in _LISTS:
            chosen[name] = f"{current}, {value}"
        elif key == "retry-after":
            chosen[name] = str(max(int(current), int(value)))
        elif key == "x-ratelimit-remaining":
            if int(value) < int(current):
                chosen[name] = value
                chosen["X-RateLimit-Limit"] = fields.get("X-RateLimit-Limit", chosen.get("X-RateLimit-Limit") or "")
        elif key != "x-ratelimit-limit":  # goes with its remaining, above
            chosen[name] = value
