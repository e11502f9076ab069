"""A partition, not only a crash: the primary cut off from its
replica and sentinels by nft rules (tbpartition.py) while the clients on
127.0.0.1 still reach it. Sentinel promotes the replica; clients whose
connections predate the cut go on with the old primary, clients that
connect afterwards find the new one. Healed, Sentinel turns the old
primary into a replica of the new one and what it admitted meanwhile is
gone. Counted: what each side admitted, and minted = both - budget.

Skips where nft rules can't be added (no nft, not root).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tbload import Load, minted, stop_all
from tbpartition import CannotPartition, check_can_partition, drop_table, partition
from tbsentinel import Topology, topology
from test_failover import (
    BUCKET,
    KEYS,
    MAX_LAG,
    assert_answers_from,
    limiter,
    report,
    require_a_replica,
    run_past_switch,
    saturate,
)

from redis_tokenbucket import Limiter


@pytest.fixture(autouse=True)
def _stop_loads() -> Iterator[None]:
    yield
    stop_all()


@pytest.fixture
def topo(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Topology]:
    try:
        check_can_partition()
    except CannotPartition as e:
        pytest.skip(f"no partition test: {e}")
    drop_table()  # a table a killed run left
    try:
        with topology(tmp_path, module=request.param == "module") as t:
            yield t
    finally:
        drop_table()


# How long the replica's link is down before the crash.
BEHIND = 5.0


def wait_answered(load: Load, since: float, timeout: float = 20) -> None:
    """Until the load has an answer from Redis (not degraded) after `since`."""
    deadline = time.monotonic() + timeout
    while not any(a.at > since and not a.degraded for a in load.tally.answers[-50:]):
        assert time.monotonic() < deadline, "the load never got an answer from Redis"
        time.sleep(0.05)


def admitted_between(load: Load, start: float, end: float) -> int:
    return sum(a.allowed and not a.degraded and start <= a.at < end for a in load.tally.answers)


@pytest.mark.parametrize(("topo", "min_replicas"), [("module", False), ("lua", True)], indirect=["topo"],
                         ids=["module-defaults", "lua-min-replicas"])  # fmt: skip
def test_partition(topo: Topology, min_replicas: bool, capsys: Any, record_property: Any) -> None:
    if min_replicas:
        require_a_replica(topo)
    old_lim = limiter(topo, "closed")
    old_side = saturate(old_lim)
    with partition(topo):
        cut = time.time()
        promoted = topo.wait_promoted()
        new_lim: Limiter = limiter(topo, "closed")
        new_side = saturate(new_lim)
        wait_answered(new_side, cut)
        # The clients on 127.0.0.1 still reach the old primary.
        if not min_replicas:
            wait_answered(old_side, time.time())
    healed = time.time()
    demoted = topo.wait_demoted(topo.primary)
    wait_answered(old_side, time.time())  # the old side's clients found the new primary
    time.sleep(2)  # as run_past_switch: until the buckets are spent
    tallies = [old_side.stop(), new_side.stop()]

    lost = admitted_between(old_side, cut, demoted)
    excess = minted(BUCKET, tallies)
    setting = "min-replicas" if min_replicas else "defaults"
    report(capsys, record_property, f"partition, {'module' if topo.module else 'lua'}, {setting}",
           old_side_admitted_after_cut=lost, new_side_admitted=tallies[1].admitted, minted=excess,
           partition_s=round(healed - cut, 1), healed_to_demoted_s=round(demoted - healed, 1))  # fmt: skip
    # Every answer came from one primary or the other: both sides admitted.
    assert tallies[1].admitted > 0
    assert_answers_from(new_lim, promoted)
    assert_answers_from(old_lim, promoted)
    if min_replicas:
        # The old primary stopped taking writes within MAX_LAG + 2 s of the
        # cut (the lag counts in whole seconds, the replica acknowledges
        # once a second, the count is refreshed once a second).
        bound = len(KEYS) * (math.ceil(BUCKET.rate * (MAX_LAG + 2)) + 1)
        assert lost <= bound
        assert excess <= bound
    else:
        # Without it, the old primary admitted for as long as the partition
        # and the heal lasted, and all of it is lost.
        assert lost > len(KEYS) * BUCKET.rate * (healed - cut) / 2
        assert excess > 0


@pytest.mark.parametrize(("topo", "min_replicas"), [("module", False), ("lua", True)], indirect=["topo"],
                         ids=["module-defaults", "lua-min-replicas"])  # fmt: skip
def test_crash_with_the_replica_behind(topo: Topology, min_replicas: bool, capsys: Any, record_property: Any) -> None:
    """The replica's link to the primary cut for BEHIND s under load (the
    sentinels still see the primary), then the primary killed: the replica
    lacks those seconds. Defaults: the primary admits all along, and that
    is minted (up to a burst per bucket). min-replicas-to-write 1 (max-lag
    1): the primary stops admitting within MAX_LAG + 2 s of the cut, and
    no more than that much of the rate is at risk."""
    if min_replicas:
        require_a_replica(topo)
    lim = limiter(topo, "closed")
    load = saturate(lim)
    with partition(topo, sentinels=False):
        cut = time.time()
        time.sleep(BEHIND)
        topo.kill_primary()
        killed = time.time()
    promoted, tally = run_past_switch(topo, load)

    # What the primary admitted after the cut never reached the replica.
    at_risk = admitted_between(load, cut, killed)
    excess = minted(BUCKET, [tally])
    setting = "min-replicas" if min_replicas else "defaults"
    report(capsys, record_property, f"crash {BEHIND:g} s behind, {'module' if topo.module else 'lua'}, {setting}",
           admitted=tally.admitted, admitted_after_the_cut=at_risk, minted=excess)  # fmt: skip
    assert_answers_from(lim, promoted)
    # Minted is what was lost, less what the buckets' max hides: a bucket
    # the switch left full can't hold more than max.
    assert excess <= min(at_risk + len(KEYS), len(KEYS) * BUCKET.max)
    bound = len(KEYS) * (math.ceil(BUCKET.rate * (MAX_LAG + 2)) + 1)
    if min_replicas:
        assert at_risk <= bound
    else:
        assert at_risk > bound  # the primary took writes for all of BEHIND s
        assert excess > 0
