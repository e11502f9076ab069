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


class Streamed:
    """What a client that went away mid-stream saw: the status, the headers
    and the body chunks it read."""

    def __init__(self) -> None:
        self.status = 0
        self.headers: dict[str, str] = {}
        self.chunks: list[bytes] = []


async def read_then_disconnect(
    app: Callable[..., Any],
    path: str,
    headers: Optional[dict[str, str]] = None,
    chunks: int = 1,
    while_connected: Optional[Callable[[], Any]] = None,
    disconnect: bool = True,
) -> Streamed:
    """A GET of `path` that reads `chunks` body chunks, then goes away: the
    server's `http.disconnect` is what the app receives next, as uvicorn
    sends it when the client's socket closes, and what it sends then is
    dropped. The app's next send waits while `while_connected()` (awaited)
    runs. With
    `disconnect=False` the client then reads the rest of the answer."""
    import asyncio

    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()],
        "client": (DEFAULT_PEER, 50000),
        "server": ("testserver", 80),
    }
    seen = Streamed()
    read_enough = asyncio.Event()
    go_on = asyncio.Event()
    gone = asyncio.Event()
    requested = False

    async def receive() -> dict[str, Any]:
        nonlocal requested
        if not requested:
            requested = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if gone.is_set():
            return  # dropped, as uvicorn drops what is sent to a closed connection
        if message["type"] == "http.response.start":
            seen.status = message["status"]
            seen.headers = {k.decode(): v.decode() for k, v in message["headers"]}
        elif message["type"] == "http.response.body":
            if message.get("body"):
                seen.chunks.append(message["body"])
            if not message.get("more_body", False):
                read_enough.set()  # the whole answer: nothing left to go away from
            elif not read_enough.is_set() and len(seen.chunks) >= chunks:
                read_enough.set()
                await go_on.wait()

    task = asyncio.ensure_future(app(scope, receive, send))
    await read_enough.wait()
    if while_connected is not None:
        await while_connected()
    if disconnect:
        gone.set()
    go_on.set()
    await task
    return seen
