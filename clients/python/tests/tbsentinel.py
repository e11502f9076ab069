"""A Sentinel topology for the failover tests and `make bench-failover`:
one primary, one replica and three sentinels (Debian's Redis 7.0), each on
its own loopback address, so that nft rules can cut the primary off from
the others while clients on 127.0.0.1 still reach it (Linux answers all of
127.0.0.0/8 on lo). Every node also sends from its own address
(`bind-source-addr`), so a rule on an address means that node.

    127.0.0.2  primary        127.0.0.4-6  sentinels (quorum 2)
    127.0.0.3  replica        127.0.0.1    the clients
    127.0.0.7  a second replica, where asked for (`replicas=2`)

Sentinel marks the primary down after `down_after_ms` (1000 ms here), so a
failover takes a few seconds. Not less: at 300 ms, on two busy cores, the
sentinels found the replica they had just promoted down too (its links
were new) and failed over again, twice in two seconds, losing the writes
each one took. Never an address outside 127.0.0.0/8.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Optional

import redis
import redis.sentinel
from tbservers import Server, binary

MASTER = "tb"
PRIMARY_HOST = "127.0.0.2"
REPLICA_HOSTS = ("127.0.0.3", "127.0.0.7")
SENTINEL_HOSTS = ("127.0.0.4", "127.0.0.5", "127.0.0.6")
CLIENT_HOST = "127.0.0.1"


class SentinelServer(Server):
    """A redis-server in sentinel mode: its config file is its own (Sentinel
    rewrites it), monitoring the primary as MASTER."""

    def __init__(self, workdir: Path, host: str, primary: Server, down_after_ms: int, failover_timeout_ms: int) -> None:
        super().__init__("redis-7.0", workdir, host=host)
        self.primary = primary
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms

    def command(self) -> list[str]:
        conf = self.workdir / "sentinel.conf"
        conf.write_text(
            f"port {self.port}\nbind {self.host}\nbind-source-addr {self.host}\nprotected-mode no\n"
            f"dir {self.workdir}\nlogfile {self.log}\n"
            f"sentinel monitor {MASTER} {self.primary.host} {self.primary.port} 2\n"
            f"sentinel down-after-milliseconds {MASTER} {self.down_after_ms}\n"
            f"sentinel failover-timeout {MASTER} {self.failover_timeout_ms}\n"
        )
        return [binary(self.kind), str(conf), "--sentinel"]


class Topology:
    """One primary, one replica (or two), three sentinels; `module` loads
    the module on the data nodes (else the limiter finds only Lua).
    `start()` returns once every sentinel knows the replicas and the other
    sentinels, so a failover can happen; `stop()` kills everything,
    whatever state it is in. With one replica, the promoted one has none:
    WAIT 1 and min-replicas-to-write 1 fail on it until another joins."""

    def __init__(
        self,
        workdir: Path,
        *,
        module: bool,
        replicas: int = 1,
        down_after_ms: int = 1000,
        failover_timeout_ms: int = 4000,
    ):
        self.workdir = workdir
        self.module = module
        self.primary = Server("redis-7.0", workdir / "primary", *self._node_args(PRIMARY_HOST),
                              module=module, host=PRIMARY_HOST)  # fmt: skip
        if not 1 <= replicas <= len(REPLICA_HOSTS):
            raise ValueError(f"replicas must be 1 to {len(REPLICA_HOSTS)}")
        self.replica_count = replicas
        self.replicas: list[Server] = []
        self.sentinels: list[SentinelServer] = []
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms

    @staticmethod
    def _node_args(host: str) -> tuple[str, ...]:
        # Protected mode takes only 127.0.0.1's connections; every address
        # here is a loopback one.
        return ("--bind-source-addr", host, "--protected-mode", "no")

    @property
    def nodes(self) -> list[Server]:
        return [self.primary, *self.replicas, *self.sentinels]

    def start(self) -> Topology:
        try:
            self.primary.start()
            for i, host in enumerate(REPLICA_HOSTS[: self.replica_count]):
                replica = Server("redis-7.0", self.workdir / f"replica{i}", *self._node_args(host),
                                 "--replicaof", self.primary.host, str(self.primary.port),
                                 module=self.module, host=host)  # fmt: skip
                self.replicas.append(replica)
                replica.start()
                self._wait(lambda r=replica: self._link_up(r), "the replica never synced")
            for i, host in enumerate(SENTINEL_HOSTS):
                sentinel = SentinelServer(self.workdir / f"sentinel{i}", host, self.primary,
                                          self.down_after_ms, self.failover_timeout_ms)  # fmt: skip
                self.sentinels.append(sentinel)
                sentinel.start()
            self._wait(self._sentinels_ready, "the sentinels never found each other and the replica", 30)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    # -- clients ---------------------------------------------------------

    def sentinel(self, **kwargs: Any) -> redis.sentinel.Sentinel:
        """redis-py's Sentinel client over the three sentinels; `kwargs`
        go to the connections it makes to the primary."""
        return redis.sentinel.Sentinel(
            [(s.host, s.port) for s in self.sentinels], sentinel_kwargs={"socket_timeout": 0.5}, **kwargs
        )

    def master_address(self) -> Optional[tuple[str, int]]:
        """The primary every sentinel that answers agrees on, once none of
        them sees it down; None while they disagree or one still does."""
        seen = set()
        for s in self.sentinels:
            try:
                with s.client(socket_timeout=0.5, decode_responses=True) as c:
                    info = c.sentinel_master(MASTER)
            except redis.RedisError:
                continue
            flags = info["flags"] if isinstance(info["flags"], str) else ",".join(info["flags"])  # a set on RESP3
            if "s_down" in flags or "o_down" in flags or "failover" in flags:
                return None
            seen.add((info["ip"], int(info["port"])))
        return seen.pop() if len(seen) == 1 else None

    def wait_promoted(self, timeout: float = 30) -> Server:
        """Waits until the sentinels agree a replica is the primary and it
        answers as one; returns it."""
        found: list[Server] = []

        def promoted() -> bool:
            address = self.master_address()
            found[:] = [r for r in self.replicas if (r.host, r.port) == address and self.role(r) == "master"]
            return bool(found)

        self._wait(promoted, "Sentinel did not promote a replica", timeout)
        return found[0]

    def wait_demoted(self, node: Server, timeout: float = 40) -> float:
        """Waits until Sentinel has made the old primary a replica of the new
        one and it has synced (its own writes are gone then). Returns when
        it was first seen a replica (time.time(), to within 50 ms): from
        then on it took no write."""
        self._wait(lambda: self.role(node) == "slave", "Sentinel did not turn the old primary into a replica", timeout)
        demoted = time.time()
        self._wait(lambda: self._link_up(node), "the old primary did not sync with the new one", timeout)
        return demoted

    # -- faults ----------------------------------------------------------

    def kill_primary(self) -> None:
        """SIGKILL: no shutdown, nothing more sent to the replica."""
        assert self.primary.proc is not None
        self.primary.proc.send_signal(signal.SIGKILL)
        self.primary.proc.wait()

    def wait_replicated(self, timeout_ms: int = 2000) -> None:
        """WAIT on the primary: every replica has every write made so far."""
        with self.primary.client() as c:
            acked = int(c.execute_command("WAIT", len(self.replicas), timeout_ms))
        if acked < len(self.replicas):
            raise RuntimeError("the replica did not acknowledge the primary's writes")

    # -- state -----------------------------------------------------------

    @staticmethod
    def role(node: Server) -> str:
        try:
            with node.client(socket_timeout=0.5, decode_responses=True) as c:
                return str(c.info("replication")["role"])
        except redis.RedisError:
            return "down"

    @staticmethod
    def _link_up(node: Server) -> bool:
        try:
            with node.client(socket_timeout=0.5, decode_responses=True) as c:
                info = c.info("replication")
        except redis.RedisError:
            return False
        return bool(info.get("role") == "slave" and info.get("master_link_status") == "up")

    def _sentinels_ready(self) -> bool:
        for s in self.sentinels:
            with s.client(socket_timeout=0.5, decode_responses=True) as c:
                info = c.sentinel_master(MASTER)
            if (
                int(info["num-slaves"]) < len(self.replicas)
                or int(info["num-other-sentinels"]) < len(self.sentinels) - 1
            ):
                return False
        return True

    @staticmethod
    def _wait(ok: Any, what: str, timeout: float = 15) -> None:
        deadline = time.monotonic() + timeout
        while not ok():
            if time.monotonic() > deadline:
                raise RuntimeError(what)
            time.sleep(0.05)


@contextmanager
def topology(workdir: Path, *, module: bool, **kwargs: Any) -> Iterator[Topology]:
    """A started Topology, stopped however the block ends."""
    topo = Topology(workdir, module=module, **kwargs)
    topo.start()
    try:
        yield topo
    finally:
        topo.stop()
