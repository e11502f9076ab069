"""A live reshard under load (docs/operations.md, Resharding): one slot
moved key by key with MIGRATE while threads call consume_many and acquire
with a bucket on keys of that slot, one drained and one full (an absent
key, so Redis answers TRYAGAIN until the slot has moved). No error
reaches the callers, no call is answered by the failure policy, and the
drained bucket admits no more than its budget."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from redis.cluster import RedisCluster
from tbservers import Cluster

from redis_tokenbucket import Bucket, Concurrency, Limiter

TAG = "{reshard}"
HOT = Bucket(10, 5, name="hot")  # drained at the start: 5 a second after that
FULL = Bucket(1e6, 1e6, name="full")  # back to full within a µs: its key is absent
SLOTS = Concurrency(1000, 60_000, name="slots")


def move_slot(cluster: Cluster, owner_port: int, slot: int, pause: float) -> None:
    """Moves `slot` from the node at `owner_port` to the next one, key by
    key, `pause` seconds per key, then assigns it there on every node."""
    admins = [n.client(decode_responses=True) for n in cluster.nodes]
    try:
        ids = [a.execute_command("CLUSTER", "MYID") for a in admins]
        owner = next(i for i, n in enumerate(cluster.nodes) if n.port == owner_port)
        target = (owner + 1) % len(admins)
        src, dst = admins[owner], admins[target]
        dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", ids[owner])
        src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", ids[target])
        port = cluster.nodes[target].port
        while keys := src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 1):
            src.execute_command("MIGRATE", "127.0.0.1", port, "", 0, 5000, "KEYS", *keys)
            time.sleep(pause)
        for a in admins:
            a.execute_command("CLUSTER", "SETSLOT", slot, "NODE", ids[target])
    finally:
        for a in admins:
            a.close()


# Each backend once, each under one policy: closed would deny for the
# reshard, open would admit past the budget, so both are watched (4 s each).
@pytest.mark.parametrize(("module", "on_error"), [(True, "closed"), (False, "open")], ids=["module", "library"])
def test_a_slot_moved_under_load_is_no_outage_and_no_bypass(tmp_path: Path, module: bool, on_error: Any) -> None:
    cluster = Cluster("redis-7.0", tmp_path / "cluster", module=module).start()
    try:
        rc = RedisCluster(host="127.0.0.1", port=cluster.port)
        lim = Limiter(rc, on_error=on_error, timeout=2, breaker=False)
        hot, full = f"{TAG}:hot", f"{TAG}:full"
        assert lim.consume(hot, HOT, HOT.max).allowed  # drained
        # Keys to move before the limiter's, so the slot takes a while.
        for i in range(40):
            rc.set(f"{TAG}:filler:{i}", "x")
        slot = rc.keyslot(hot)
        admitted, errors, degraded, calls = [], [], [], [0]
        stop = threading.Event()

        def load(kind: str) -> None:
            n = 0
            while not stop.is_set():
                n += 1
                try:
                    if kind == "many":
                        d: Any = lim.consume_many([(hot, HOT, 1), (full, FULL, 1)])
                        ok = d.allowed
                    else:
                        d = lim.acquire(f"{TAG}:lease", SLOTS, 1, [(hot, HOT, 1), (full, FULL, 1)], id=f"t{n}")
                        ok = d.acquired
                        if ok:
                            lim.release(d)
                except Exception as exc:
                    errors.append(repr(exc))
                    continue
                calls[0] += 1
                if d.degraded:
                    degraded.append(d)
                elif ok:
                    admitted.append(time.monotonic())
                time.sleep(0.01)

        started = time.monotonic()
        threads = [threading.Thread(target=load, args=(k,)) for k in ("many", "many", "acquire")]
        for t in threads:
            t.start()
        move_slot(cluster, rc.get_node_from_key(hot).port, slot, 0.03)
        time.sleep(0.2)
        stop.set()
        for t in threads:
            t.join()
        elapsed = time.monotonic() - started
        assert errors == []
        assert degraded == [], "a call was answered by the failure policy during the reshard"
        assert calls[0] > 50
        # The drained bucket's refill over the run, plus one token of rounding.
        assert len(admitted) <= HOT.rate * elapsed + 1, (len(admitted), elapsed)
        assert len(admitted) >= 1
        rc.close()
    finally:
        cluster.stop()
