"""A network partition on loopback, with nftables: the primary of a
tbsentinel Topology cut off from its replica and its sentinels, while the
clients on 127.0.0.1 still reach it.

The rules live in a table of their own, TABLE (its name ends with this
process's id, so a test and a bench running at once don't delete each
other's), and drop only TCP between the primary's port on 127.0.0.2 and
the other nodes' addresses (the replicas and the sentinels connect to the
primary, never the other way), so a parallel run on other ports is left
alone. The table is deleted when the block ends, however it ends, and
before rules are added so is any leftover one of a process that is gone.
Every address a rule names is checked to be in 127.0.0.0/8.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tbsentinel import Topology

PREFIX = "tb_failover_partition_"
TABLE = f"{PREFIX}{os.getpid()}"
LOOPBACK = ipaddress.ip_network("127.0.0.0/8")


class CannotPartition(RuntimeError):
    """No nft, or no right to add rules: the caller skips."""


def _nft(*args: str, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["nft", *args], input=stdin, capture_output=True, text=True, check=check, timeout=10)


def drop_table() -> None:
    """Deletes TABLE, and the tables of processes that are gone (a run
    killed before it could clean up), if there are any."""
    if not shutil.which("nft"):
        return
    listed = _nft("list", "tables", "inet", check=False).stdout.split()
    for name in listed:
        if not name.startswith(PREFIX):
            continue
        pid = name[len(PREFIX) :]
        if name == TABLE or (pid.isdigit() and not Path(f"/proc/{pid}").exists()):
            _nft("delete", "table", "inet", name, check=False)


def rules(primary: tuple[str, int], others: list[str]) -> str:
    """The ruleset: TCP to the primary's port from the others, and from it
    to them, dropped (both ways, so neither side sees the other)."""
    for address in [primary[0], *others]:
        if ipaddress.ip_address(address) not in LOOPBACK:
            raise ValueError(f"{address} is not a loopback address: no rule names it")
    host, port = primary
    peers = ", ".join(others)
    return (
        f"table inet {TABLE} {{\n"
        "  chain cut {\n"
        "    type filter hook output priority 0; policy accept;\n"
        f"    ip saddr {{ {peers} }} ip daddr {host} tcp dport {port} drop\n"
        f"    ip saddr {host} tcp sport {port} ip daddr {{ {peers} }} drop\n"
        "  }\n"
        "}\n"
    )


def check_can_partition() -> None:
    if not shutil.which("nft"):
        raise CannotPartition("nft is not installed (apt-get install nftables; `make deps` does)")
    if os.geteuid() != 0:
        raise CannotPartition("adding nft rules needs root (CAP_NET_ADMIN)")


@contextmanager
def partition(topo: Topology, *, sentinels: bool = True) -> Iterator[None]:
    """Cuts the primary off from the replicas and the sentinels for the
    block (`sentinels=False`: from the replicas only, a replication link
    down while Sentinel still sees the primary); heals when it ends."""
    check_can_partition()
    others = [*(r.host for r in topo.replicas), *(s.host for s in topo.sentinels if sentinels)]
    ruleset = rules((topo.primary.host, topo.primary.port), others)
    drop_table()
    try:
        try:
            _nft("-f", "-", stdin=ruleset)
        except subprocess.CalledProcessError as e:
            raise CannotPartition(f"nft refused the rules: {e.stderr.strip()}") from None
        yield
    finally:
        drop_table()
