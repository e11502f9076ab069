"""Test-only ASGI helpers, shared with examples/fastapi-gateway/tests."""

from __future__ import annotations

from typing import Any, Callable

DEFAULT_PEER = "203.0.113.7"


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
