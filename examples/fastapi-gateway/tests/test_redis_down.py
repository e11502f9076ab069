"""Redis unreachable or without TB.*: fail-open, fail-closed, /readyz."""

from __future__ import annotations

import logging

import pytest
from conftest import auth
from redis_tokenbucket import NoBackendError
from tbservers import free_port

CHAT = {"prompt": "hi", "max_tokens": 1}


def test_fail_open_and_fail_closed_when_redis_stops(make_client, own_server, caplog):
    client = make_client(url=own_server.url, breaker_failures=4)
    assert client.get("/v1/models", headers=auth("k-free")).status_code == 200
    assert client.post("/v1/chat", headers=auth("k-free"), json=CHAT).status_code == 200

    own_server.stop()
    caplog.clear()
    # Fail-open: admitted, without headers (there is nothing to report), and loudly logged.
    res = client.get("/v1/models", headers=auth("k-free"))
    assert res.status_code == 200 and "RateLimit" not in res.headers
    errors = [rec for rec in caplog.records if rec.levelno >= logging.ERROR]
    assert len(errors) == 1 and "fail-open" in errors[0].getMessage()
    # Fail-closed: refused.
    res = client.post("/v1/chat", headers=auth("k-free"), json=CHAT)
    assert res.status_code == 503 and res.json() == {"error": "rate_limiter_unavailable"}
    assert "fail-closed" in caplog.records[-1].getMessage()
    res = client.get("/readyz")
    assert res.status_code == 503 and res.json()["breaker"] == "closed"  # 3 failures, with this check's own
    # The 4th opens the breaker: the routes' policies answer without trying
    # Redis, and /readyz says so.
    assert client.get("/v1/models", headers=auth("k-free")).status_code == 200
    res = client.get("/readyz")
    assert res.status_code == 503
    assert res.json()["breaker"] == "open" and res.json()["reason"].startswith("CircuitOpenError")


def test_redis_down_from_the_start(make_client, caplog):
    client = make_client(url=f"redis://127.0.0.1:{free_port()}/0")
    assert client.get("/healthz").status_code == 200  # alive, not ready
    res = client.get("/readyz")
    assert res.status_code == 503 and res.json()["ready"] is False
    assert client.get("/v1/models", headers=auth("k-free")).status_code == 200
    assert client.post("/v1/chat", headers=auth("k-free"), json=CHAT).status_code == 503


def test_readyz_names_the_backend(make_client, server):
    res = make_client().get("/readyz")
    assert res.status_code == 200
    assert res.json() == {"ready": True, "backend": server.backend, "breaker": "closed"}


def test_readyz_unready_without_module_or_scripting(make_client, server, r):
    """A Redis user that may run neither TB.* (where the module is loaded
    it may) nor FUNCTION, FCALL or EVAL: nothing can limit."""
    r.acl_setuser("noscripts", enabled=True, passwords=["+pw"], keys=["*"], commands=["+@all", "-@scripting"])
    client = make_client(url=f"redis://noscripts:pw@127.0.0.1:{server.port}/0")
    res = client.get("/readyz")
    if server.with_module:  # TB.* is not scripting
        assert res.json() == {"ready": True, "backend": "module", "breaker": "closed"}
    else:
        assert res.status_code == 503
        assert "no permissions to run" in res.json()["reason"]
        # A deployment that can't limit is an error, not an outage: no
        # policy hides it (docs/failure-model.md).
        with pytest.raises(NoBackendError):
            client.get("/v1/models", headers=auth("k-free"))


def test_library_flushed_under_the_gateway_is_loaded_again(make_client, server, r):
    client = make_client()
    assert client.get("/v1/models", headers=auth("k-free")).status_code == 200
    r.function_flush()
    assert client.get("/v1/models", headers=auth("k-free")).status_code == 200
    assert client.get("/readyz").json()["backend"] == server.backend
    assert bool(r.function_list(library="tb")) == (not server.with_module)
