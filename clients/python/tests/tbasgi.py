"""Test-only ASGI helpers, shared with examples/fastapi-gateway/tests."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Optional

DEFAULT_PEER = "203.0.113.7"

# The trusted-proxy rule of redis_tokenbucket.fastapi.client_ip, as
# (peer, X-Forwarded-For or None, the client address it yields) with
# these proxies trusted.
TRUSTED_PROXIES = ["10.0.0.0/8", "fd00::/8"]
CLIENT_IP_CASES: list[tuple[str, Optional[str], str]] = [
    ("203.0.113.7", None, "203.0.113.7"),
    # Anyone can send the header: from an untrusted peer it is ignored.
    ("203.0.113.7", "198.51.100.1", "203.0.113.7"),
    ("10.0.0.5", "198.51.100.1", "198.51.100.1"),
    # The rightmost untrusted hop; what the client wrote left of it is ignored.
    ("10.0.0.5", "1.2.3.4, 198.51.100.1, 10.1.1.1", "198.51.100.1"),
    # All trusted: the leftmost.
    ("10.0.0.5", "10.9.9.9, 10.1.1.1", "10.9.9.9"),
    # Garbage ends the walk at the proxy that passed it on.
    ("10.0.0.5", "1.2.3.4, not-an-ip", "10.0.0.5"),
    ("10.0.0.5", "", "10.0.0.5"),
    # IPv6 clients are limited per /64; IPv4-mapped addresses as IPv4.
    ("2001:db8:1:2:3:4:5:6", None, "2001:db8:1:2::/64"),
    ("fd00::1", "2001:db8::9", "2001:db8::/64"),
    ("::ffff:203.0.113.9", None, "203.0.113.9"),
]


class PeerFromHeader:
    """Wraps an app so that the socket peer address comes from the
    X-Test-Peer header (Starlette's TestClient always reports "testclient")."""

    def __init__(self, app: Callable[..., Any], default: str = DEFAULT_PEER) -> None:
        self.app = app
        self.default = default

    async def __call__(self, scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]) -> None:
        if scope["type"] == "http":
            peer = dict(scope["headers"]).get(b"x-test-peer", self.default.encode()).decode()
            scope = {**scope, "client": (peer, 50000)}
        await self.app(scope, receive, send)
