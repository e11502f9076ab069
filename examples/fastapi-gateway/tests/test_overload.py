"""Overload never buys a bypass (issue 26): the gateway under uvicorn with
2 workers and wrk at 400 connections for 5 s, 50 saturated users. An
admission count, not a timing: at most the exact budget plus one token per
user is admitted, and nothing is degraded while Redis is healthy. Each
worker's limiter sends its commands on one shared connection, at most 100
in flight (the client pool's max_connections, redis-py 6+'s default), so
requests do wait for a slot and for the event loop."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[1] / "bench"))
from gateway import USERS, run_load  # noqa: E402


def test_overload_never_buys_a_bypass(server, r):
    load = run_load(server.url, connections=400, seconds=5)
    assert load.denied > 0, f"the users were not saturated: {load}"
    assert load.degraded == 0, load
    assert load.admitted <= load.budget + USERS, load
    assert load.other == 0, load
