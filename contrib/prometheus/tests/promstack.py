"""redis_exporter and Prometheus from Debian's packages, on free loopback
ports, each in its own directory, killed afterwards; Prometheus's HTTP
API; and a gateway's metrics endpoint (the Python package's limiters with
the example's hook, python/tb_metrics.py). Used by the live test and the
scrape-cost measurement.

Redis servers come from the Python package's test kit
(clients/python/tests/tbservers.py), the one way the repository starts them.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import redis
from prometheus_client import CollectorRegistry, start_http_server

ROOT = Path(__file__).resolve().parents[3]
CONTRIB = ROOT / "contrib" / "prometheus"
EXAMPLE = CONTRIB / "python" / "tb_metrics.py"
COLLECT_SCRIPT = CONTRIB / "tb-collect.lua"
RULES = CONTRIB / "tb-rules.yml"
DASHBOARD = CONTRIB / "tb-dashboard.json"
LUA_LIBRARY = ROOT / "lua" / "tb.lua"

# Debian's names for the binaries (packages prometheus-redis-exporter, prometheus).
EXPORTER_BIN = "prometheus-redis-exporter"
PROMETHEUS_BIN = "prometheus"
PROMTOOL_BIN = "promtool"

# Appended, not prepended, as examples/fastapi-gateway does.
sys.path.append(str(ROOT / "clients" / "python" / "tests"))
sys.path.append(str(EXAMPLE.parent))
from tbservers import Server, free_port  # noqa: E402

__all__ = ["Exporter", "MetricsEndpoint", "Prometheus", "Server", "free_port", "wait_for"]

T = TypeVar("T")

# Generous: a loaded 2-core machine may take seconds where an idle one takes
# milliseconds. Waits return as soon as their condition holds.
DEADLINE = 60.0


def wait_for(what: str, probe: Callable[[], T], done: Callable[[T], bool], deadline: float = DEADLINE) -> T:
    """Calls `probe` until `done` holds for its result and returns that
    result; fails with the last result after `deadline` seconds."""
    end = time.monotonic() + deadline
    while True:
        value = probe()
        if done(value):
            return value
        if time.monotonic() > end:
            raise AssertionError(f"{what}: still {value!r} after {deadline:.0f} s")
        time.sleep(0.2)


def raw_info(client: redis.Redis, section: str) -> str:
    """INFO <section> as the server wrote it (redis-py would parse it into a dict)."""
    client.response_callbacks.pop("INFO", None)
    raw = client.execute_command("INFO", section)
    assert isinstance(raw, bytes)
    return raw.decode()


def http_get(url: str, timeout: float = 10.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        body: bytes = response.read()
        return body


class Process:
    """A server process listening on one free loopback port, started again
    on another port if someone took the first before it could bind."""

    name = "process"

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def log(self) -> Path:
        return self.workdir / f"{self.name}.log"

    def command(self) -> list[str]:
        raise NotImplementedError

    def ready_url(self) -> str:
        raise NotImplementedError

    def start(self: P) -> P:
        self.workdir.mkdir(parents=True, exist_ok=True)
        for _ in range(10):
            if self._start_once():
                return self
        raise RuntimeError(f"{self.name} did not start, see {self.log}")

    def _start_once(self) -> bool:
        self.port = free_port()
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir)
        end = time.monotonic() + DEADLINE
        while True:
            if self.proc.poll() is not None:
                if "address already in use" in self.log.read_text(errors="replace"):
                    return False  # lost a race for the port: try another
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}, see {self.log}")
            try:
                http_get(self.ready_url(), timeout=1)
                return True
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                if time.monotonic() > end:
                    self.stop()
                    raise RuntimeError(f"{self.name} did not answer, see {self.log}") from None
                time.sleep(0.05)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


P = TypeVar("P", bound=Process)


class Exporter(Process):
    """redis_exporter for one Redis, with a -script or none."""

    name = "redis_exporter"

    def __init__(self, workdir: Path, redis_port: int, script: Path | None = COLLECT_SCRIPT) -> None:
        super().__init__(workdir)
        self.redis_port = redis_port
        self.script = script

    def command(self) -> list[str]:
        script = ["-script", str(self.script)] if self.script else []
        return [EXPORTER_BIN, "-redis.addr", f"redis://127.0.0.1:{self.redis_port}",
                "-web.listen-address", self.address, *script]  # fmt: skip

    def ready_url(self) -> str:
        # /health answers without scraping Redis: waiting on it sends Redis nothing.
        return f"http://{self.address}/health"

    def scrape(self) -> str:
        """One scrape, as Prometheus does it: the exporter queries Redis now."""
        return http_get(f"http://{self.address}/metrics").decode()


class MetricsEndpoint:
    """A prometheus_client registry served over HTTP on a free loopback
    port, as a gateway process serves its metrics."""

    def __init__(self, registry: CollectorRegistry) -> None:
        # Port 0: the kernel picks a free one, so no other process can take it first.
        self._server, self._thread = start_http_server(0, addr="127.0.0.1", registry=registry)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self._server.server_port}"

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


class Prometheus(Process):
    """Prometheus scraping `targets` every second as job "redis" (the job
    the rules expect), and `gateways` as job "gateway", and evaluating
    `rule_files` every second."""

    name = "prometheus"

    def __init__(
        self, workdir: Path, targets: list[str], rule_files: tuple[Path, ...] = (RULES,), gateways: tuple[str, ...] = ()
    ) -> None:
        super().__init__(workdir)
        jobs = {"redis": targets, "gateway": list(gateways)}
        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(f) for f in rule_files],
            "scrape_configs": [{"job_name": j, "static_configs": [{"targets": t}]} for j, t in jobs.items() if t],
        }
        self.config = workdir / "prometheus.yml"
        workdir.mkdir(parents=True, exist_ok=True)
        self.config.write_text(json.dumps(config, indent=2))  # JSON is YAML

    def command(self) -> list[str]:
        return [PROMETHEUS_BIN, f"--config.file={self.config}", f"--storage.tsdb.path={self.workdir / 'data'}",
                f"--web.listen-address={self.address}"]  # fmt: skip

    def ready_url(self) -> str:
        return f"http://{self.address}/-/ready"

    def api(self, path: str, **params: str) -> Any:
        """GET /api/v1/<path>; the `data` of a successful answer. A query
        Prometheus refuses (bad PromQL) raises with its error text."""
        url = f"http://{self.address}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        try:
            body = json.loads(http_get(url))
        except urllib.error.HTTPError as e:
            body = json.loads(e.read())
        if body.get("status") != "success":
            raise ValueError(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's samples: [{"metric": {...}, "value": [t, "v"]}]."""
        data = self.api("query", query=expr)
        if data["resultType"] != "vector":
            raise ValueError(f"{expr}: a {data['resultType']}, not a vector")
        result: list[dict[str, Any]] = data["result"]
        return result

    def values(self, expr: str, label: str) -> dict[str, float]:
        """An instant query's values by one label."""
        return {s["metric"].get(label, ""): float(s["value"][1]) for s in self.query(expr)}

    def table(self, expr: str, *labels: str) -> dict[tuple[str, ...], float]:
        """An instant query's values keyed by the values of `labels`."""
        return {tuple(s["metric"].get(n, "") for n in labels): float(s["value"][1]) for s in self.query(expr)}

    def value(self, expr: str) -> float | None:
        """The value of a query that selects at most one series."""
        samples = self.query(expr)
        if len(samples) > 1:
            raise ValueError(f"{expr}: {len(samples)} series, expected at most one")
        return float(samples[0]["value"][1]) if samples else None

    def settles(self, expr: str, expected: float) -> None:
        """Waits until the query's one value is `expected`. Polled, also for
        values already there: on a loaded machine a scrape can time out, and
        Prometheus then marks the target's series stale until the next one."""
        wait_for(expr, lambda: self.value(expr), lambda v: v == expected)

    def settles_on_labels(self, expr: str, label: str, expected: set[str]) -> None:
        """Waits until the query's series carry exactly these values of `label`."""
        wait_for(f"{expr} by {label}", lambda: set(self.values(expr, label)), lambda v: v == expected)

    def series(self, selector: str) -> list[dict[str, str]]:
        """Every series the selector matched in the last hour."""
        result: list[dict[str, str]] = self.api("series", **{"match[]": selector, "start": str(time.time() - 3600)})
        return result
