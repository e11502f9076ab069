"""POST /v1/chat with "stream": true: server-sent events from the stub
model, a slot of the deployment's `model_streams` and one of the user's
`streams` per stream, the user's taken in the same call as the request
buckets and the LLM reservation, renewed while it streams, released after
the last byte or at once when the client goes away; the reservation
settled with what was generated."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from redis_tokenbucket import Limiter

from app import DEPLOYMENT_STREAMS_KEY
from conftest import API_KEYS, LIMITS, auth, bucket
from llm import LLMError, StubLLM

sys.path.append(str(Path(__file__).resolve().parents[1] / "bench"))
from gateway import serve_gateway  # noqa: E402

BUDGET = LIMITS.tiers["free"].llm  # 100 tokens, refill negligible
STREAMS_KEY = "rl:streams:u-free"
LLM_KEY = "rl:llm:user:u-free"
PROMPT = "a b c d"  # 4 prompt tokens; the stub answers d c b a


def events(text: str) -> list[Any]:
    """The data of each server-sent event, JSON-decoded (but [DONE])."""
    out: list[Any] = []
    for block in text.split("\n\n"):
        for line in block.splitlines():
            if line.startswith("data: "):
                data = line[len("data: ") :]
                out.append(data if data == "[DONE]" else json.loads(data))
    return out


def stream_chat(client: Any, max_tokens: int = 10, key: str = "k-free") -> Any:
    return client.post("/v1/chat", headers=auth(key), json={"prompt": PROMPT, "max_tokens": max_tokens, "stream": True})


@pytest.fixture
def balance(server, r):
    return lambda: server.peek(r, LLM_KEY, BUDGET)[1]


def test_a_streamed_chat_sends_its_tokens_and_settles_the_reservation(make_client, balance, r, cluster_mode):
    client = make_client(cluster_mode=cluster_mode)
    res = stream_chat(client)
    assert res.status_code == 200 and res.headers["content-type"].startswith("text/event-stream")
    assert events(res.text) == [
        {"token": "d"}, {"token": "c"}, {"token": "b"}, {"token": "a"},
        {"usage": {"prompt_tokens": 4, "completion_tokens": 4, "reserved_tokens": 14}},
        "[DONE]",
    ]  # fmt: skip
    # Reserved 4 + 10, used 4 + 4: the rest came back after the stream.
    assert balance() == 100 - 8
    # The slots are given back; the headers name the policies as the draft
    # does, the deployment's first.
    assert r.exists(STREAMS_KEY) == 0 and r.exists(DEPLOYMENT_STREAMS_KEY) == 0
    assert res.headers["RateLimit-Policy"].startswith(
        '"model_streams";q=5;qu="concurrent-requests", "streams";q=2;qu="concurrent-requests", "user";q=3;'
    )
    assert res.headers["RateLimit"].startswith('"model_streams";r=4, "streams";r=1, "user";r=2;')


def test_a_full_set_of_streams_is_a_429_that_charges_nothing(make_client, server, r, balance):
    held = Limiter(r)
    streams = LIMITS.streams("free")
    for _ in range(streams.limit):
        assert held.acquire(STREAMS_KEY, streams).acquired
    client = make_client()
    res = stream_chat(client)
    assert res.status_code == 429
    assert res.json() == {"error": "rate_limited", "dimension": "streams", "retry_after": 60}
    assert res.headers["Retry-After"] == "60"
    # Both policies named, as on an admitted stream; the deployment's slot
    # is back, so all 5 are free.
    assert res.headers["RateLimit-Policy"].startswith(
        '"model_streams";q=5;qu="concurrent-requests", "streams";q=2;qu="concurrent-requests", "user";q=3;'
    )
    assert res.headers["RateLimit"].startswith('"model_streams";r=5, "streams";r=0;t=60, "user";r=3;')
    # All or nothing: no request token, no LLM token spent, and the
    # deployment's slot given back.
    assert server.peek(r, "rl:user:u-free", LIMITS.tiers["free"].user)[1] == 3
    assert balance() == 100
    assert held.in_flight(DEPLOYMENT_STREAMS_KEY) == 0
    # A non-streamed chat takes no slot.
    assert client.post("/v1/chat", headers=auth("k-free"), json={"prompt": PROMPT, "max_tokens": 10}).status_code == 200


def test_the_deployments_cap_is_a_429_that_charges_nothing(make_client, server, r, balance):
    held = Limiter(r)
    cap = LIMITS.deployment_streams()
    for _ in range(cap.limit):
        assert held.acquire(DEPLOYMENT_STREAMS_KEY, cap).acquired
    res = stream_chat(make_client())
    assert res.status_code == 429
    assert res.json() == {"error": "rate_limited", "dimension": "model_streams", "retry_after": 60}
    assert res.headers["RateLimit"].startswith('"model_streams";r=0;t=60')
    # Refused before the user's slot and the buckets were asked for.
    assert r.exists(STREAMS_KEY) == 0
    assert server.peek(r, "rl:user:u-free", LIMITS.tiers["free"].user)[1] == 3
    assert balance() == 100
    assert held.in_flight(DEPLOYMENT_STREAMS_KEY) == cap.limit


def test_streams_of_several_users_share_the_deployments_cap(make_client, r):
    client = make_client()
    cap = LIMITS.deployment_streams()
    held = Limiter(r)
    # Three slots taken elsewhere leave two: one each for u-free and u-std.
    for _ in range(cap.limit - 2):
        assert held.acquire(DEPLOYMENT_STREAMS_KEY, cap).acquired
    for key in ("k-free", "k-std"):
        assert stream_chat(client, key=key).status_code == 200
    # Both gave theirs back after their last byte.
    assert held.in_flight(DEPLOYMENT_STREAMS_KEY) == cap.limit - 2


def test_a_budget_that_cant_pay_takes_no_slot(make_client, r, balance):
    client = make_client()
    assert stream_chat(client, max_tokens=90).status_code == 200  # 94 reserved, 8 used: 92 left
    res = stream_chat(client, max_tokens=95)  # 99 > 92
    assert res.status_code == 429 and res.json()["dimension"] == "llm"
    assert r.exists(STREAMS_KEY) == 0 and balance() == 92
    assert r.exists(DEPLOYMENT_STREAMS_KEY) == 0


class FailingLLM(StubLLM):
    """Fails after `after` tokens."""

    def __init__(self, after: int) -> None:
        super().__init__()
        self.after = after

    async def stream(self, prompt: str, max_tokens: int) -> AsyncIterator[str]:
        sent = 0
        async for token in super().stream(prompt, max_tokens):
            if sent == self.after:
                raise LLMError("model backend exploded")
            sent += 1
            yield token


@pytest.mark.parametrize(("after", "left"), [(0, 100), (2, 100 - 4 - 2)])
def test_a_model_that_fails_mid_stream(make_client, balance, r, after: int, left: int):
    """Nothing generated: the whole reservation back. Some: what was used."""
    res = stream_chat(make_client(llm=FailingLLM(after)))
    assert res.status_code == 200
    assert events(res.text)[-1] == {"error": "upstream_failed"} and len(events(res.text)) == after + 1
    assert balance() == left and r.exists(STREAMS_KEY) == 0


def test_an_unauthenticated_stream_is_refused(make_client, r):
    res = make_client().post("/v1/chat", json={"prompt": "hi", "max_tokens": 1, "stream": True})
    assert res.status_code == 401 and r.keys("rl:streams:*") == []


# ---- over real HTTP, under uvicorn ---------------------------------------------------


BIG = 100_000  # the free tier's LLM budget here: room for several streams


def gateway_env(server: Any, token_delay_ms: int, stream_lease_ms: int) -> dict[str, str]:
    free = LIMITS.tiers["free"].model_copy(update={"llm": bucket(BIG)})
    limits = LIMITS.model_copy(update={"stream_lease_ms": stream_lease_ms, "tiers": {**LIMITS.tiers, "free": free}})
    keys = {k: p.model_dump() for k, p in API_KEYS.items()}
    return {
        "GATEWAY_REDIS_URL": server.url,
        "GATEWAY_LIMITS": limits.model_dump_json(),
        "GATEWAY_API_KEYS": json.dumps(keys),
        "GATEWAY_STUB_TOKEN_DELAY_MS": str(token_delay_ms),
    }


def until(check: Callable[[], Any], seconds: float, what: str) -> Any:
    deadline = time.monotonic() + seconds
    while not (value := check()):
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {seconds} s")
        time.sleep(0.01)
    return value


LONG_PROMPT = " ".join(f"w{i}" for i in range(40))


class Stream:
    """A streamed chat over HTTP, its headers and first event read. (Its
    line iterator is kept: dropping it would close the connection.)"""

    def __init__(self, http: httpx.Client, port: int) -> None:
        body = {"prompt": LONG_PROMPT, "max_tokens": 40, "stream": True}
        request = http.build_request("POST", f"http://127.0.0.1:{port}/v1/chat", json=body, headers=auth("k-free"))
        self.response = http.send(request, stream=True)
        assert self.response.status_code == 200
        self.lines = self.response.iter_lines()
        assert next(self.lines).startswith('data: {"token"')

    def rest(self) -> list[str]:
        return [line for line in self.lines if line]

    def close(self) -> None:
        """The client goes away: its connection closed."""
        self.response.close()


def test_a_client_gone_mid_stream_frees_its_slot_at_once(server, r):
    """Over real HTTP: two streams fill the free tier; the third is refused;
    a client that closes its connection frees its slot at once (the lease
    would live 60 s), and the next stream gets it."""
    with serve_gateway(gateway_env(server, token_delay_ms=200, stream_lease_ms=60_000)) as (port, _):
        with httpx.Client(timeout=30) as first, httpx.Client(timeout=30) as second, httpx.Client(timeout=30) as third:
            a = Stream(first, port)
            b = Stream(second, port)
            assert r.hlen(STREAMS_KEY) == 2
            body = {"prompt": LONG_PROMPT, "max_tokens": 40, "stream": True}
            refused = third.post(f"http://127.0.0.1:{port}/v1/chat", json=body, headers=auth("k-free"))
            assert refused.status_code == 429 and refused.json()["dimension"] == "streams"
            a.close()  # the client goes away mid-stream
            until(lambda: r.hlen(STREAMS_KEY) == 1, 5, "the slot freed")
            c = Stream(third, port)
            assert r.hlen(STREAMS_KEY) == 2
            b.close()
            c.close()
            until(lambda: r.exists(STREAMS_KEY) == 0, 5, "every slot freed")
    # Each stream reserved 40 + 40 and was cut short: settled with its 40
    # prompt tokens and the 1 to 39 it generated, the rest refunded.
    assert BIG - 3 * 80 + 3 <= float(r.hget(LLM_KEY, "tokens")) <= BIG - 3 * 41 + 1


def test_a_long_stream_keeps_its_slot_by_renewing_it(server, r):
    """A lease of 600 ms and a stream of about 4 s: only renewals keep the
    slot for it; once the stream is over, the slot is given back."""
    with serve_gateway(gateway_env(server, token_delay_ms=100, stream_lease_ms=600)) as (port, _):
        with httpx.Client(timeout=30) as http:
            stream = Stream(http, port)
            first_expiry = int(r.hvals(STREAMS_KEY)[0].split(":")[0])
            time.sleep(2.0)  # more than three leases
            assert r.hlen(STREAMS_KEY) == 1
            assert int(r.hvals(STREAMS_KEY)[0].split(":")[0]) > first_expiry + 1_000_000  # renewed
            assert stream.rest()[-1] == "data: [DONE]"
            stream.close()
        until(lambda: r.exists(STREAMS_KEY) == 0, 5, "the slot given back")
