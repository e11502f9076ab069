"""Streamed chats at the edge: one `streams` slot per stream, taken in the
access phase in the same TB.ACQUIRE as the request's buckets and its LLM
reservation, renewed while the body flows, released when the request ends
(on a 0 s timer: no cosockets in the log phase), at once when the client
goes away or the model fails; the cap holds across two nginx instances."""

from __future__ import annotations

import json
import socket
import time
from typing import Any

import redis
from conftest import LIMITS, auth

STREAMS_KEY = "rl:streams:u-free"
LLM_KEY = "rl:llm:user:u-free"


def words(n: int) -> str:
    return " ".join(f"w{i}" for i in range(n))


class Stream:
    """A streamed chat read as it comes, on a socket of its own."""

    def __init__(self, port: int, prompt: str, max_tokens: int, headers: dict[str, str]) -> None:
        body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "stream": True}).encode()
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        lines = ["POST /v1/chat HTTP/1.1", "Host: x", "Content-Type: application/json",
                 f"Content-Length: {len(body)}", *(f"{k}: {v}" for k, v in headers.items())]  # fmt: skip
        self.sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
        self.buf = b""
        while b"\r\n\r\n" not in self.buf:
            self._more()
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        self.status = int(head.split()[1])
        self.headers = {k.lower(): v for k, v in (line.split(": ", 1) for line in head.decode().split("\r\n")[1:])}

    def _more(self) -> bool:
        data = self.sock.recv(65536)
        self.buf += data
        return bool(data)

    def events(self, n: int) -> list[Any]:
        """The next `n` events' data (fewer if the stream ends)."""
        out: list[Any] = []
        while len(out) < n:
            at = self.buf.find(b"data: ")
            end = self.buf.find(b"\n\n", at) if at >= 0 else -1
            if end >= 0:
                data = self.buf[at + 6 : end].decode()
                out.append(data if data == "[DONE]" else json.loads(data))
                self.buf = self.buf[end + 2 :]
            elif not self._more():
                break
        return out

    def rest(self) -> bytes:
        try:
            while self._more():
                pass
        except OSError:
            pass
        return self.buf

    def close(self) -> None:
        self.sock.close()


def live(r: redis.Redis, server: Any, key: str = STREAMS_KEY) -> int:
    """The key's live weight, as Redis counts it."""
    if server.backend == "module":
        return int(r.execute_command("TB.INFLIGHT", key))
    return int(r.fcall_ro("tb_inflight", 1, key))


def until(check, timeout: float = 2.0) -> float:  # type: ignore[no-untyped-def]
    """Seconds until check() held; fails after `timeout`."""
    t = time.monotonic()
    while not check():
        assert time.monotonic() - t < timeout, "timed out"
        time.sleep(0.01)
    return time.monotonic() - t


def test_a_streamed_chat_sends_its_tokens_gives_its_slot_back_and_settles(server, r, gateway):
    g = gateway()
    s = Stream(g.port, "a b c d", 10, auth("k-free"))
    assert s.status == 200 and s.headers["content-type"].startswith("text/event-stream")
    assert s.headers["ratelimit-policy"].startswith('"streams";q=2;qu="concurrent-requests", "user";q=3;')
    assert s.headers["ratelimit"].startswith('"streams";r=1, "user";r=2;')
    assert s.events(6) == [
        {"token": "d"}, {"token": "c"}, {"token": "b"}, {"token": "a"},
        {"usage": {"prompt_tokens": 4, "completion_tokens": 4, "reserved_tokens": 14}},
        "[DONE]",
    ]  # fmt: skip
    s.close()
    until(lambda: r.exists(STREAMS_KEY) == 0)
    until(lambda: int(float(r.hget(LLM_KEY, "tokens") or 0)) == 100 - 8)


def test_the_stream_cap_holds_across_two_nginx_and_a_client_gone_frees_its_slot_at_once(server, r, gateway):
    free = {**LIMITS["tiers"]["free"], "llm": {"max": 1000, "rate": 0.001}}
    limits = {**LIMITS, "tiers": {**LIMITS["tiers"], "free": free}}
    a = gateway(limits=limits, stub_token_delay_ms=100)
    b = gateway(limits=limits, stub_token_delay_ms=100)
    first = Stream(a.port, words(40), 40, auth("k-free"))
    second = Stream(b.port, words(40), 40, auth("k-free"))
    assert first.status == second.status == 200
    assert first.events(1) and second.events(1)
    assert live(r, server) == 2
    third = a.request("POST", "/v1/chat", auth("k-free"), {"prompt": "x", "max_tokens": 1, "stream": True})
    assert third.status == 429
    assert third.json() == {"error": "rate_limited", "dimension": "streams", "retry_after": 60}
    assert third.headers["retry-after"] == "60"
    assert third.headers["ratelimit-policy"].startswith('"streams";q=2;qu="concurrent-requests", "user";q=3;')
    assert third.headers["ratelimit"].startswith('"streams";r=0;t=60, "user";r=1;')
    # The client of the first goes away mid-stream: its slot is free at once,
    # not at the lease's expiry (60 s), and a stream on the other node gets it.
    first.close()
    assert until(lambda: live(r, server) == 1) < 1.0
    fourth = Stream(b.port, "x y", 2, auth("k-free"))
    assert fourth.status == 200 and fourth.events(4)[-1] == "[DONE]"
    second.close()
    fourth.close()
    until(lambda: r.exists(STREAMS_KEY) == 0)


def test_a_model_that_fails_mid_stream_frees_the_slot_and_keeps_what_was_used(server, r, gateway):
    g = gateway(stub_token_delay_ms=20)
    s = Stream(g.port, words(10), 10, {**auth("k-free"), "X-Stub-Fail-After": "2"})
    assert s.status == 200
    assert s.rest().count(b'data: {"token"') == 2, "then the connection is cut"
    s.close()
    until(lambda: r.exists(STREAMS_KEY) == 0)
    # 10 prompt tokens and the 2 generated are kept; the rest comes back.
    until(lambda: int(float(r.hget(LLM_KEY, "tokens") or 0)) == 100 - 12)


def test_a_long_stream_keeps_its_slot_by_renewing_it(server, r, gateway):
    limits = {**LIMITS, "stream_lease_ms": 1500}
    g = gateway(limits=limits, stub_token_delay_ms=300)
    s = Stream(g.port, words(10), 10, auth("k-free"))  # about 3 s, twice the lease
    assert s.status == 200
    time.sleep(2.4)
    assert live(r, server) == 1, "renewed past its 1.5 s"
    events = s.events(12)
    assert events[-1] == "[DONE]" and len(events) == 12
    s.close()
    until(lambda: r.exists(STREAMS_KEY) == 0)
