"""When Redis fails, and when nginx is only short of something: the breaker
in the shared dict (one per node), each policy, exact again at once when
Redis is back, and local exhaustion shed, never admitted."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import tbservers
from conftest import SLOW, lua_config
from tbservers import Server

COOLDOWN = 1.0
BREAKER = {"failures": 3, "window": 10, "cooldown": COOLDOWN}

POLICY_LOCATIONS = """
        location ~ ^/(open|closed|local)$ {
            access_by_lua_block { LIMITS[ngx.var[1]]:access() }
            content_by_lua_block { ngx.say("ok") }
        }
        location ~ ^/state/(open|closed|local)$ {
            content_by_lua_block { ngx.say(LIMITS[ngx.var[1]].limiter:breaker_state()) }
        }
"""


def policies_init(url: str, max_: int = 4) -> str:
    tables = []
    for policy in ("open", "closed", "local"):
        config = lua_config(
            url, name=policy, on_error=policy, processes=2, breaker=BREAKER,
            rules=[f'{{ name = "user", max = {max_}, rate = {SLOW}, key = "$http_x_user" }}'],
        )  # fmt: skip
        tables.append(f'["{policy}"] = tb.new({config})')
    return 'local tb = require("resty.tokenbucket")\nLIMITS = {\n' + ",\n".join(tables) + "\n}"


@pytest.fixture(params=["module", "library"])
def own_server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Server]:
    """A server of this test's own, to kill and start again on its port."""
    s = Server("redis-7.0", tmp_path / "redis", module=request.param == "module").start()
    yield s
    s.stop()


def restart(server: Server) -> None:
    """The same server again, on the same port, empty."""
    port = server.port
    original = tbservers.free_port
    tbservers.free_port = lambda host="127.0.0.1": port
    try:
        server.start()
    finally:
        tbservers.free_port = original


def states(n, policy: str) -> set[str]:
    """The breaker's state as every worker sees it (a few tries each)."""
    return {n.get(f"/state/{policy}").text.strip() for _ in range(6)}


def test_redis_killed_the_breaker_opens_and_each_policy_holds_then_exact_at_once(own_server, nginx):
    n = nginx(policies_init(own_server.url), locations=POLICY_LOCATIONS)
    for policy in ("open", "closed", "local"):
        ok = n.get(f"/{policy}", {"X-User": "warm"})
        assert ok.status == 200 and "ratelimit" in ok.headers
    own_server.stop()

    # Failing closed: 503 with Retry-After, no fields.
    for _ in range(4):
        res = n.get("/closed", {"X-User": "u"})
        assert res.status == 503 and res.headers["retry-after"] == "1" and "ratelimit" not in res.headers
        assert res.json()["detail"] == "The rate limiter is unavailable."
    assert states(n, "closed") == {"open"}, "every worker sees the one breaker"
    # Failing open: admitted, unlimited, no fields.
    for _ in range(6):
        res = n.get("/open", {"X-User": "u"})
        assert res.status == 200 and "ratelimit" not in res.headers
    # Local: each of the 2 workers has half of max 4.
    codes = []
    for _ in range(10):
        res = n.get("/local", {"X-User": "u"})
        codes.append(res.status)
        assert "ratelimit" not in res.headers
        if res.status == 429:
            assert int(res.headers["retry-after"]) > 0
    assert 2 <= codes.count(200) <= 4 and codes.count(429) == 10 - codes.count(200), codes
    assert len(n.log_lines("fail-closed: denied")) <= 2, "degraded answers are logged at most once a second"

    # Redis back, empty: the breaker still answers until its cooldown ends...
    restart(own_server)
    assert n.get("/closed", {"X-User": "v"}).status == 503
    time.sleep(COOLDOWN + 0.1)
    # ...then one request probes and closes it, and Redis's answers are exact at once.
    codes = [n.get("/closed", {"X-User": "v"}).status for _ in range(6)]
    assert codes == [200, 200, 200, 200, 429, 429]
    assert states(n, "closed") == {"closed"}
    r = own_server.client()
    assert int(float(r.hget("rl:user:v", "tokens"))) == 0


def test_a_frozen_redis_costs_a_budget_then_nothing(own_server, nginx):
    n = nginx(policies_init(own_server.url), locations=POLICY_LOCATIONS, workers=1)
    assert n.get("/closed", {"X-User": "w"}).status == 200  # the backend is known
    own_server.pause()
    try:
        took = []
        for _ in range(5):
            t = time.monotonic()
            assert n.get("/closed", {"X-User": "w"}).status == 503
            took.append(time.monotonic() - t)
        # A written command without a reply in 100 ms is Redis failing: the
        # first three wait their budget, then the breaker answers at once.
        assert all(t < 0.6 for t in took), took
        assert states(n, "closed") == {"open"}
    finally:
        own_server.resume()


def test_out_of_descriptors_is_shed_never_admitted_never_counted(server, r, nginx):
    """A worker out of file descriptors (EMFILE) can't open a connection
    to Redis: its requests are shed (503, Retry-After), under every
    policy, and the breaker does not count them."""
    init = policies_init(server.url)
    n = nginx(
        init,
        locations=POLICY_LOCATIONS
        + """
        location = /health { content_by_lua_block { ngx.say("ok") } }
    """,
        workers=1,
        main="worker_rlimit_nofile 48;",
        http="keepalive_requests 100000;",
    )
    conns = []
    try:
        # Idle keep-alive connections until the worker can accept no more.
        for _ in range(60):
            s = socket.create_connection(("127.0.0.1", n.port), timeout=0.5)
            conns.append(s)
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            try:
                if b"200 OK" not in s.recv(4096):
                    break
            except TimeoutError:
                break  # not accepted: the worker is out of descriptors
        else:
            pytest.fail("the worker never ran out of descriptors")
        for policy in ("open", "closed", "local"):
            for _ in range(4):
                conns[0].sendall(f"GET /{policy} HTTP/1.1\r\nHost: x\r\nX-User: z\r\n\r\n".encode())
                reply = conns[0].recv(4096).decode()
                assert reply.startswith("HTTP/1.1 503"), reply
                assert "Retry-After: 1" in reply and "The server is overloaded." in reply
    finally:
        for s in conns:
            s.close()
    time.sleep(0.6)  # nginx accepts again after its back-off
    assert {n.get(f"/state/{p}").text.strip() for p in ("open", "closed", "local")} == {"closed"}
    assert r.keys("rl:user:z") == []
    assert n.log_lines("Too many open files")
