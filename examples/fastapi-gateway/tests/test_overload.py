"""Overload never buys a bypass, nor an outage: the gateway
in 2 workers and wrk at 400 connections for 5 s, 50 saturated users.
Counts, not timings: at most the exact budget plus one token per user is
admitted, nothing is degraded while Redis is healthy, and the users, far
over their budget, are told so (429) more often than turned away (503).
Each worker's limiter pipelines its commands on one connection, and its
event loop reads their replies late: they are Redis's answers still."""

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
    assert load.denied > load.shed + load.closed, load
