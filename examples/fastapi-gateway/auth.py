"""Who is calling: the API key's principal and the client's IP address."""

from __future__ import annotations

import ipaddress
from typing import Sequence

from pydantic import IPvAnyNetwork
from starlette.requests import Request

from config import Principal, key_id

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def authenticate(request: Request, api_keys: dict[str, Principal]) -> None:
    """Sets request.state.principal, .user_id, .tier and .key_id (the key's
    SHA-256) from the X-API-Key header; all None without a valid key. The
    raw key goes no further than this function."""
    raw = request.headers.get("x-api-key")
    kid = key_id(raw) if raw else None
    principal = api_keys.get(kid) if kid else None
    state = request.state
    state.principal = principal
    state.key_id = kid if principal else None
    state.user_id = principal.user_id if principal else None
    state.tier = principal.tier if principal else None


def _parse(text: str) -> IPAddress | None:
    try:
        addr = ipaddress.ip_address(text.strip())
    except ValueError:
        return None
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped:
        return addr.ipv4_mapped
    return addr


def bucket_address(addr: IPAddress) -> str:
    """What the IP bucket is keyed on. An IPv6 client usually owns a whole
    /64 and can rotate through it, so the /64 is one client."""
    if isinstance(addr, ipaddress.IPv6Address):
        return str(ipaddress.IPv6Network((addr, 64), strict=False))
    return str(addr)


def client_ip(request: Request, trusted: Sequence[IPvAnyNetwork]) -> str:
    """The client address: the socket peer, unless the peer is a trusted
    proxy, in which case X-Forwarded-For is walked from the right (each proxy
    appends the address it received from) to the first untrusted hop.

    Anyone can send X-Forwarded-For, so believing it from any peer would let
    a client pick its own IP bucket, a fresh one per request. The hops left
    of the first untrusted one were written by the client and are ignored.
    """
    peer = request.client.host if request.client else ""
    addr = _parse(peer)
    if addr is None:
        return peer or "unknown"
    hops = ",".join(request.headers.getlist("x-forwarded-for")).split(",")
    for hop in reversed(hops):
        if not any(addr in net for net in trusted):
            break
        # A malformed hop ends the walk: the last trusted proxy stands for it.
        if (prev := _parse(hop)) is None:
            break
        addr = prev
    return bucket_address(addr)
