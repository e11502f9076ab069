#!/usr/bin/env python3
"""`make bench-failover`: what a Sentinel failover costs in tokens, and what
each setting that bounds it costs in latency and throughput.

The topology is the Python tests' (clients/python/tests/tbsentinel.py):
Debian's Redis 7.0 with the module, primary 127.0.0.2, replicas 127.0.0.3
and 127.0.0.7, three sentinels on 127.0.0.4-6 (quorum 2, down-after 1000
ms); the client on 127.0.0.1 goes through redis-py's Sentinel client. Two
replicas, because with one the promoted primary has none left: WAIT 1 and
min-replicas-to-write 1 would fail every decision after a failover. The
settings:

- defaults: asynchronous replication as it comes;
- min-replicas: `min-replicas-to-write 1` and `min-replicas-max-lag 1` on
  every data node;
- WAIT: the Limiter's `wait_replicas=1, wait_timeout=0.05` (`WAIT 1 50`
  behind each decision, one round trip): an admission no replica
  acknowledged is Redis failing, answered by on_error.

Each decision is the package's Limiter (`on_error="closed"`, the default
breaker) over the Sentinel client: Redis failing is a denial, degraded.

Tokens minted: 4 saturated buckets (max 500, 50 a second each, so 10 s
from empty to full, longer than a switch and the lag before it: a
bucket's max caps what one crash can mint; offered 250 calls a second
each), the exact budget of the run against what Redis
admitted (clients/python/tests/tbload.py), for:

- a crash: SIGKILL of the primary under load, Sentinel promotes;
- a partition: nft rules cut the primary off from the replica and the
  sentinels (clients/python/tests/tbpartition.py; root and nft needed, else
  the rows say so); the clients connected before the cut stay on the old
  primary, clients connecting after it find the new one; healed once
  both sides answered, until Sentinel demoted the old primary.

Cost: one connection, decisions back to back for --seconds on a healthy
topology: decisions a second, p50 and p99 latency.

    python3 bench/failover.py [--report docs/benchmarks.md] [--crashes 3] [--partitions 1] [--seconds 5]
"""

from __future__ import annotations

import argparse
import logging
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import redis

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "clients/python/tests"))

from doc_section import write_section
from redis_tokenbucket import Bucket, Decision, Limiter
from tbload import Load, minted
from tbpartition import CannotPartition, check_can_partition, partition
from tbsentinel import MASTER, Topology

SETTINGS = ("defaults", "min-replicas", "WAIT")
BUCKET = Bucket(max=500, rate=50)
KEYS = [f"rl:bench:failover:{i}" for i in range(4)]
INTERVAL = 0.001  # 1,000 calls a second over the 4 keys
RATE = BUCKET.rate * len(KEYS)  # tokens a second the buckets admit together
MAX_LAG = 1
BEHIND_S = 5.0  # how long the replicas' links are down before the crash
SATURATE_S = 4.0  # the load's first burst spent before any fault
# After the first answer of the new primary, as long as a burst of max
# takes to spend at the offered 250 calls a second per key, and a second
# more: a minted token shows once the bucket that holds it is spent.
DRAIN_S = BUCKET.max / (1 / INTERVAL / len(KEYS) - BUCKET.rate) + 1
WAIT_MS = 50


def decider(client: redis.Redis, setting: str) -> Callable[[str], Decision]:
    """The package's Limiter over the Sentinel client, failing closed; for
    WAIT with its wait_replicas option."""
    wait = {"wait_replicas": 1, "wait_timeout": WAIT_MS / 1000} if setting == "WAIT" else {}
    lim = Limiter(client, on_error="closed", **wait)  # type: ignore[arg-type]
    return lambda key: lim.consume(key, BUCKET)


def start(workdir: Path, setting: str) -> Topology:
    topo = Topology(workdir, module=True, replicas=2).start()
    configure(topo, setting)
    return topo


def sentinel_client(topo: Topology) -> redis.Redis:
    return topo.sentinel(socket_timeout=0.2, socket_connect_timeout=0.2).master_for(MASTER)  # type: ignore[no-any-return]


def wait_answered(load: Load, since: float, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not any(a.at > since and not a.degraded for a in load.tally.answers[-50:]):
        if time.monotonic() > deadline:
            raise RuntimeError("the load never got an answer from Redis")
        time.sleep(0.02)


@dataclass
class Run:
    minted: int
    admitted: int
    decision_s: float  # fault to the sentinels agreeing on the new primary
    lost_side: int = 0  # partition: the old primary's admissions after the cut
    extra: dict[str, float] = field(default_factory=dict)


def crash(workdir: Path, setting: str, behind: bool = False) -> Run:
    """A crash of the primary under load; behind: once the replicas have
    fallen behind, their links to the primary cut (nft) for BEHIND_S."""
    with topology_of(workdir, setting) as topo:
        load = Load(decider(sentinel_client(topo), setting), KEYS, INTERVAL).start()
        time.sleep(SATURATE_S)
        if behind:
            with partition(topo, sentinels=False):
                time.sleep(BEHIND_S)
                topo.kill_primary()
        else:
            topo.kill_primary()
        killed, t0 = time.time(), time.monotonic()
        topo.wait_promoted()
        decision = time.monotonic() - t0
        wait_answered(load, killed)
        time.sleep(DRAIN_S)
        tally = load.stop()
    return Run(minted(BUCKET, [tally]), tally.admitted, decision)


def partitioned(workdir: Path, setting: str) -> Run:
    with topology_of(workdir, setting) as topo:
        old = Load(decider(sentinel_client(topo), setting), KEYS, INTERVAL).start()
        time.sleep(SATURATE_S)
        with partition(topo):
            cut, t0 = time.time(), time.monotonic()
            topo.wait_promoted()
            decision = time.monotonic() - t0
            new = Load(decider(sentinel_client(topo), setting), KEYS, INTERVAL).start()
            wait_answered(new, cut)
            time.sleep(1)
        healed = time.time()
        demoted = topo.wait_demoted(topo.primary)
        wait_answered(old, time.time())
        time.sleep(DRAIN_S)
        tallies = [old.stop(), new.stop()]
    lost = sum(a.allowed and not a.degraded and cut <= a.at < demoted for a in tallies[0].answers)
    extra = {"partition_s": healed - cut, "demotion_s": demoted - healed}
    return Run(
        minted(BUCKET, tallies),
        sum(t.admitted for t in tallies),
        decision,
        lost,
        extra,
    )


class topology_of:
    """A started topology with the setting, stopped on exit."""

    def __init__(self, workdir: Path, setting: str) -> None:
        self.workdir, self.setting = workdir, setting

    def __enter__(self) -> Topology:
        self.topo = start(self.workdir, self.setting)
        return self.topo

    def __exit__(self, *exc: object) -> None:
        self.topo.stop()


@dataclass
class Cost:
    per_s: float
    p50_ms: float
    p99_ms: float
    rounds: list[float]


def configure(topo: Topology, setting: str) -> None:
    """min-replicas-to-write 1 (max-lag 1) on every data node for that
    setting, 0 (the default) for the others."""
    for node in (topo.primary, *topo.replicas):
        with node.client() as c:
            c.config_set("min-replicas-to-write", 1 if setting == "min-replicas" else 0)
            c.config_set("min-replicas-max-lag", MAX_LAG)


def costs_of(workdir: Path, seconds: float, rounds: int) -> dict[str, Cost]:
    """On one healthy topology, each setting in turn for `seconds`, rounds
    interleaved: decisions a second (median of the rounds), p50 and p99 of
    every decision's latency."""
    per_s: dict[str, list[float]] = {s: [] for s in SETTINGS}
    lat: dict[str, list[float]] = {s: [] for s in SETTINGS}
    with topology_of(workdir, "defaults") as topo:
        client = sentinel_client(topo)
        for r in range(rounds):
            for setting in SETTINGS:
                configure(topo, setting)
                decide = decider(client, setting)
                for i in range(200):  # connections up, buckets drained
                    decide(KEYS[i % len(KEYS)])
                n = 0
                end = time.monotonic() + seconds
                while (t := time.monotonic()) < end:
                    v = decide(KEYS[n % len(KEYS)])
                    lat[setting].append(time.monotonic() - t)
                    if v.degraded:
                        raise RuntimeError(f"{setting}: Redis failed on a healthy topology")
                    n += 1
                per_s[setting].append(n / seconds)
                print(f"cost round {r + 1} {setting:12}: {n / seconds:8,.0f}/s", flush=True)
    out = {}
    for setting in SETTINGS:
        q = statistics.quantiles(lat[setting], n=100)
        out[setting] = Cost(statistics.median(per_s[setting]), q[49] * 1e3, q[98] * 1e3, per_s[setting])
    return out


def report(
    crashes: dict[str, list[Run]],
    behind: dict[str, list[Run]],
    parts: dict[str, list[Run]],
    costs: dict[str, Cost],
    no_partition: str,
    seconds: float,
    rounds: int,
) -> str:
    def figures(runs: list[Run]) -> str:
        return ", ".join(f"{r.minted:,}" for r in runs) if runs else "n/a"

    base = costs["defaults"]
    lines = [
        "Measured by `make bench-failover` (bench/failover.py) on this machine: Debian's",
        "Redis 7.0 with the module, one primary, two replicas, three sentinels (down-after",
        "1000 ms), each on its own loopback address; the client through redis-py's Sentinel",
        f"client on 127.0.0.1. Four saturated buckets of max {BUCKET.max:g} refilling {BUCKET.rate:g} a second each",
        f"({RATE:,.0f} tokens a second together, offered 1,000 calls a second). Minted: Redis's",
        "admissions replayed, in order, through an exact bucket per key; the deepest it went",
        "below zero, summed over the keys (what was admitted beyond the exact budget). Each",
        'decision is the Python package\'s `Limiter(client, on_error="closed")` over the',
        "Sentinel client; WAIT is its `wait_replicas=1, wait_timeout=0.05` (`WAIT 1 50` in the",
        "same round trip; an admission no replica acknowledged is Redis failing: denied).",
        "Sentinel's decision: from the kill or the cut until every sentinel named the new",
        "primary and it answered as one. The partition's old side is the clients connected",
        "before the cut (they stay on the old primary); its new side, clients that connected",
        "after the promotion. A crash behind: the replicas' links to the primary cut for",
        f"{BEHIND_S:g} s under load (Sentinel still sees the primary), then the primary killed.",
        "",
        "| setting | minted per crash (each run) | per crash, replicas behind | per partition | old primary's admissions lost in the partition | Sentinel's decision (crash; partition) |",
        "|---|---|---|---|---|---|",
    ]
    for s in SETTINGS:
        c, p = crashes[s], parts.get(s, [])
        lost = ", ".join(f"{r.lost_side:,}" for r in p) if p else "n/a"
        dec = (
            ", ".join(f"{r.decision_s:.1f}" for r in c)
            + " s; "
            + (", ".join(f"{r.decision_s:.1f}" for r in p) + " s" if p else "n/a")
        )
        lines.append(f"| {s} | {figures(c)} | {figures(behind.get(s, []))} | {figures(p)} | {lost} | {dec} |")
    lines += [""]
    if no_partition:
        lines += [f"No partition rows: {no_partition}.", ""]
    for s in SETTINGS:
        for r in parts.get(s, []):
            lines.append(
                f"- partition, {s}: cut for {r.extra['partition_s']:.1f} s (until both sides had answered), "
                f"then {r.extra['demotion_s']:.1f} s until Sentinel made the old primary a replica."
            )
    lines += [
        "",
        f"The cost of each setting on a healthy topology: one connection, decisions back to back, {rounds} rounds of",
        f"{seconds:g} s per setting, interleaved (decisions/s: the median round; p50, p99: of every decision):",
        "",
        "| setting | decisions/s | each round | p50 | p99 | decisions/s vs defaults |",
        "|---|---|---|---|---|---|",
    ]
    for s in SETTINGS:
        k = costs[s]
        each = ", ".join(f"{x:,.0f}" for x in k.rounds)
        lines.append(
            f"| {s} | {k.per_s:,.0f} | {each} | {k.p50_ms * 1e3:,.0f} µs | {k.p99_ms * 1e3:,.0f} µs "
            f"| {k.per_s / base.per_s:.2f} |"
        )
    lines += [
        "",
        "The machine is two cores shared with other work: compare the rounds before the ratios. A",
        "WAIT is a second command and a round trip to the replica on every decision;",
        "min-replicas-to-write is a counter Redis checks before each write.",
    ]
    lines += ["", "Targets:", ""]
    wait_crash = max(r.minted for r in crashes["WAIT"])
    lines.append(
        f"- WAIT: 0 tokens minted by a crash: {'met' if wait_crash <= 0 else 'missed'} (most minted: {wait_crash})."
    )
    for r in parts.get("min-replicas", []):
        bound = RATE * (MAX_LAG + r.decision_s)
        verdict = "met" if r.minted <= bound else "missed"
        lines.append(
            f"- min-replicas: a partition mints at most rate × (max-lag + Sentinel's decision) = "
            f"{RATE:,.0f}/s × ({MAX_LAG} + {r.decision_s:.1f}) s = {bound:,.0f}: {verdict} ({r.minted:,} minted)."
        )
    d = ", ".join(f"{r.minted:,}" for r in crashes["defaults"] + behind.get("defaults", []) + parts.get("defaults", []))
    lines.append(f"- defaults: measured, {d} (crashes, crashes behind, partitions).")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--report", type=Path, help="docs/benchmarks.md: replace or append its section")
    parser.add_argument("--crashes", type=int, default=3, help="crash failovers per setting")
    parser.add_argument("--partitions", type=int, default=1, help="partitions and crashes behind per setting")
    parser.add_argument("--seconds", type=float, default=3.0, help="the cost measurement per setting and round")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of the cost measurement")
    args = parser.parse_args()
    # Degraded answers are the point here, not news: the limiter logs each second of them.
    logging.getLogger("redis_tokenbucket").setLevel(logging.CRITICAL)
    # A kill (timeout, Ctrl-C) still stops the servers and drops the nft table.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    no_partition = ""
    try:
        check_can_partition()
    except CannotPartition as e:
        no_partition = str(e)
    crashes: dict[str, list[Run]] = {s: [] for s in SETTINGS}
    parts: dict[str, list[Run]] = {s: [] for s in SETTINGS} if not no_partition else {}
    behind: dict[str, list[Run]] = {s: [] for s in SETTINGS} if not no_partition else {}
    with tempfile.TemporaryDirectory(prefix="bench-failover.") as tmp:
        costs = costs_of(Path(tmp) / "cost", args.seconds, args.rounds)
        for s, k in costs.items():
            print(f"cost {s:12}: {k.per_s:8,.0f}/s p50 {k.p50_ms:.3f} ms p99 {k.p99_ms:.3f} ms", flush=True)
        n = 0
        for i in range(args.crashes):
            for s in SETTINGS:
                r = crash(Path(tmp) / f"{n}", s)
                n += 1
                crashes[s].append(r)
                print(f"crash {i + 1} {s:12}: minted {r.minted:,} (admitted {r.admitted:,}), "
                      f"decision {r.decision_s:.1f} s", flush=True)  # fmt: skip
        for i in range(args.partitions if not no_partition else 0):
            for s in SETTINGS:
                r = crash(Path(tmp) / f"{n}", s, behind=True)
                n += 1
                behind[s].append(r)
                print(f"crash behind {i + 1} {s:12}: minted {r.minted:,} (admitted {r.admitted:,}), "
                      f"decision {r.decision_s:.1f} s", flush=True)  # fmt: skip
            for s in SETTINGS:
                r = partitioned(Path(tmp) / f"{n}", s)
                n += 1
                parts[s].append(r)
                print(f"partition {i + 1} {s:12}: minted {r.minted:,}, old side lost {r.lost_side:,}, "
                      f"decision {r.decision_s:.1f} s, {r.extra}", flush=True)  # fmt: skip
    text = report(crashes, behind, parts, costs, no_partition, args.seconds, args.rounds)
    print(text)
    if args.report:
        write_section(args.report, "bench-failover", text, "What a failover costs")


if __name__ == "__main__":
    main()
