"""Sentinel failovers under load: one primary, one replica,
three sentinels (tbsentinel.py), the limiter over redis-py's Sentinel
client, saturated buckets at a steady rate, the primary killed with
SIGKILL and the replica promoted by Sentinel.

Counts, not timings: admitted by Redis over the whole run against the
exact budget (tbload.py); minted = admitted - budget. The figures per
setting are `make bench-failover`'s (docs/operations.md, "What a failover
costs"); here each run prints its own.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tbload import Load, Tally, budget, limiter_load, minted, stop_all
from tbsentinel import MASTER, Topology, topology
from tbservers import Server

from redis_tokenbucket import Bucket, Limiter

# 4 buckets of 100, 10 a second, offered 125 calls a second each: saturated
# once their first burst is spent (in under 1 s). 10 s from empty to full:
# longer than a switch and the lag before it, since a bucket's max caps
# what a crash can mint.
BUCKET = Bucket(max=100, rate=10)
KEYS = [f"rl:failover:{i}" for i in range(4)]
INTERVAL = 0.002
BACKENDS = {"module": True, "lua": False}
# min-replicas-max-lag, in seconds.
MAX_LAG = 1


def limiter(topo: Topology, on_error: str) -> Limiter:
    """The package's Limiter over the primary redis-py's Sentinel client finds."""
    primary = topo.sentinel(socket_timeout=0.2, socket_connect_timeout=0.2).master_for(MASTER)
    return Limiter(primary, on_error=on_error)  # type: ignore[arg-type]


def report(capsys: pytest.CaptureFixture[str], record_property: Any, what: str, **figures: Any) -> None:
    """Prints a run's figures into the test output (and the JUnit XML)."""
    for k, v in figures.items():
        record_property(k, v)
    with capsys.disabled():
        print(f"\n[{what}] " + ", ".join(f"{k}={v}" for k, v in figures.items()))


def saturate(lim: Limiter, seconds: float = 1.5) -> Load:
    load = limiter_load(lim, BUCKET, KEYS, INTERVAL).start()
    time.sleep(seconds)
    return load


def run_past_switch(topo: Topology, load: Load, after: float = 2.0) -> tuple[Server, Tally]:
    """Lets Sentinel promote the replica and the load get an answer from it
    (the breaker, open since the kill, lets a call through every 2 s), runs
    the load `after` s more, and stops it. 2 s: a bucket the switch left
    full (100) is spent in under one at the offered rate, and a minted
    token only shows once the bucket holding it is spent."""
    promoted = topo.wait_promoted()
    since = time.time()
    deadline = time.monotonic() + 15
    while not any(a.at > since and not a.degraded for a in load.tally.answers[-50:]):
        assert time.monotonic() < deadline, "the limiter never got an answer from the new primary"
        time.sleep(0.05)
    time.sleep(after)
    return promoted, load.stop()


@pytest.fixture(autouse=True)
def _stop_loads() -> Iterator[None]:
    yield
    stop_all()


@pytest.fixture(params=list(BACKENDS))
def topo(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Topology]:
    with topology(tmp_path, module=BACKENDS[request.param]) as t:
        yield t


# Each case starts a topology of its own (some 7 s, and a failover some 4
# s): each backend once, each policy once.
@pytest.mark.parametrize(("topo", "on_error"), [("module", "open"), ("lua", "closed")], indirect=["topo"])
def test_crash_after_replication_mints_nothing(
    topo: Topology, on_error: str, capsys: Any, record_property: Any
) -> None:
    """The replica has every write (WAIT 1 with the load paused) when the
    primary dies: not one token is minted across the switch; while no
    primary answers, the answers are on_error's (degraded), and once one
    does, Redis's again, exact."""
    lim = limiter(topo, on_error)
    load = saturate(lim)
    load.pause()
    topo.wait_replicated()
    topo.kill_primary()
    killed = time.time()
    load.resume()
    promoted, tally = run_past_switch(topo, load)

    before = [a for a in tally.answers if a.at < killed]
    after = [a for a in tally.answers if a.at >= killed]
    assert before and not any(a.degraded for a in before)
    # The switch was seen, and answered by the policy...
    assert any(a.degraded for a in after)
    assert all(a.allowed == (on_error == "open") for a in after if a.degraded)
    # ...only until Redis answered again: from the first answer of the
    # new primary on, none is degraded.
    back = next(i for i, a in enumerate(after) if not a.degraded)
    assert not any(a.degraded for a in after[back:])
    assert sum(not a.degraded for a in after) > 100

    excess = minted(BUCKET, [tally])
    report(capsys, record_property, f"crash after WAIT, {'module' if topo.module else 'lua'}, {on_error}",
           admitted=tally.admitted, degraded=tally.degraded, minted=excess)  # fmt: skip
    assert excess == 0

    assert_answers_from(lim, promoted)
    assert lim.backend == ("module" if topo.module else "functions")


def assert_answers_from(lim: Limiter, server: Server) -> None:
    """Exact again: the limiter's charge lands on `server`, and its
    answers are that server's own."""
    probe, slow = "rl:failover:probe", Bucket(max=10, rate=0.001)
    d = lim.consume(probe, slow, 3)
    assert d.allowed and not d.degraded and d.remaining == 7
    with Limiter(server.client()) as direct:
        assert direct.peek(probe, slow).remaining == 7
        direct.reset(probe)


def require_a_replica(topo: Topology) -> None:
    """min-replicas-to-write 1, min-replicas-max-lag MAX_LAG: the primary
    takes a write only while a replica acknowledged within MAX_LAG s."""
    with topo.primary.client() as c:
        c.config_set("min-replicas-to-write", 1)
        c.config_set("min-replicas-max-lag", MAX_LAG)


@pytest.mark.parametrize(("topo", "min_replicas"), [("module", False), ("lua", True)], indirect=["topo"],
                         ids=["module-defaults", "lua-min-replicas"])  # fmt: skip
def test_crash_under_load(topo: Topology, min_replicas: bool, capsys: Any, record_property: Any) -> None:
    """The primary dies with the load running: what the replica had not yet
    received is lost, and the new primary admits it again. Measured. The
    bound either way: the promoted state is an earlier state of each
    bucket, so at most one burst (`max`) per bucket is minted. With
    min-replicas-to-write 1 and min-replicas-max-lag 1 the primary took a
    write only while the replica had acknowledged within the last
    MAX_LAG s (Redis counts in whole seconds and refreshes the count once
    a second, and the replica acknowledges once a second: MAX_LAG + 2 s
    in all), so at most that many seconds of admissions can be lost."""
    if min_replicas:
        require_a_replica(topo)
    lim = limiter(topo, "closed")
    load = saturate(lim)
    topo.kill_primary()
    _, tally = run_past_switch(topo, load)

    excess = minted(BUCKET, [tally])
    setting = "min-replicas" if min_replicas else "defaults"
    report(capsys, record_property, f"crash under load, {'module' if topo.module else 'lua'}, {setting}",
           admitted=tally.admitted, degraded=tally.degraded, minted=excess)  # fmt: skip
    assert tally.admitted > len(KEYS) * BUCKET.max  # the load ran, past the first burst
    assert excess <= len(KEYS) * BUCKET.max
    if min_replicas:
        assert excess <= len(KEYS) * (math.ceil(BUCKET.rate * (MAX_LAG + 2)) + 1)


@pytest.mark.parametrize("topo", ["module"], indirect=True)
def test_budget_counts_a_plain_run(topo: Topology) -> None:
    """The yardstick itself: with no failover, a saturated run admits its
    exact budget, to within one refill interval per bucket."""
    lim = limiter(topo, "raise")
    tally = saturate(lim, 1.5).stop()
    assert tally.first_sent is not None and tally.last_answer is not None
    exact = budget(BUCKET, len(KEYS), tally.first_sent, tally.last_answer)
    assert exact - 2 * len(KEYS) <= tally.admitted <= exact
    assert tally.degraded == 0
