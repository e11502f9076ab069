"""The gateway under wrk: 2 workers (serve.py: a listening socket each),
N saturated users each with a user bucket of max 20 and rate 2/s (the
other buckets out of the way), GET /v1/models (fail-open: the route a
bypass would hurt most).

`run_load()` is shared by tests/test_overload.py (one admission count at
400 connections) and `make bench-gateway` (`python bench/gateway.py
--report ../../docs/benchmarks.md`: 200, 400 and 1,000 connections, each
row three times and the worst reported, on the module and on the Lua
library).
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.append(str(Path(__file__).resolve().parents[3] / "bench"))
from doc_section import write_section  # noqa: E402
from gateway_load import USER_MAX, USER_RATE, USERS, budget, gateway_env, wrk  # noqa: E402

HERE = Path(__file__).resolve().parent
EXAMPLE = HERE.parent
ROOT = EXAMPLE.parents[1]


@dataclass
class Load:
    connections: int
    seconds: float
    requests: int
    p50_ms: float
    p99_ms: float
    admitted: int
    denied: int
    degraded: int
    shed: int
    closed: int
    other: int
    socket_errors: int
    cpu_s: float = 0.0  # the workers' CPU seconds over the run

    @property
    def cpu_share(self) -> float:
        """The workers' CPU over the run, as a share of two cores: below 1,
        the machine's other work took some."""
        return self.cpu_s / (2 * self.seconds)

    @property
    def budget(self) -> float:
        """What the users' buckets can admit over the run, exactly."""
        return budget(self.seconds)

    @property
    def req_per_s(self) -> float:
        return self.requests / self.seconds


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _wait_http(port: int, proc: subprocess.Popen[bytes], log: Path, marker: bytes = b"") -> None:
    """/healthz answers, and `marker` is in the server's log."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the gateway exited: {log.read_text()[-2000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), 1) as s:
                s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                if b"200 OK" in s.recv(1024) and marker in log.read_bytes():
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError("the gateway did not answer /healthz")


@contextmanager
def serve_gateway(env: dict[str, str], workers: int = 1) -> Iterator[tuple[int, list[int]]]:
    """The gateway (serve.py: uvicorn, a listening socket per worker),
    configured by `env` (GATEWAY_* variables), on a free port; yields the
    port and the workers' pids once every worker serves; stopped on exit.
    Shared with the tests that need real HTTP (tests/test_streams.py)."""
    port = _free_port()
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "serve.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "serve.py", "--workers", str(workers), "--port", str(port), "--backlog", "4096"],
                cwd=EXAMPLE, env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        try:
            _wait_http(port, proc, log, b"workers up")
            yield port, _workers(proc.pid)
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def _workers(parent: int) -> list[int]:
    """serve.py's worker processes (multiprocessing's resource tracker aside)."""
    children = Path(f"/proc/{parent}/task/{parent}/children")
    pids = [int(p) for p in children.read_text().split()] if children.exists() else []
    return [p for p in pids if b"resource_tracker" not in Path(f"/proc/{p}/cmdline").read_bytes()]


def _cpu_seconds(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / os.sysconf("SC_CLK_TCK")


def run_load(redis_url: str, connections: int, seconds: int, workers: int = 2) -> Load:
    """Starts the gateway, drives it with wrk, stops it; the answers counted."""
    with serve_gateway(gateway_env(redis_url), workers) as (port, pids):
        cpu = _cpu_seconds(pids)
        [f] = wrk([port], connections, seconds)
        cpu = _cpu_seconds(pids) - cpu
    return Load(
        connections, f["duration_us"] / 1e6, f["requests"], f["p50_us"] / 1000, f["p99_us"] / 1000,
        f["admitted"], f["denied"], f["degraded"], f["shed"], f["closed"], f["other"], f["socket_errors"], cpu,
    )  # fmt: skip


# ---- make bench-gateway --------------------------------------------------------

RUNS = 3


def _server(module: bool, workdir: Path) -> Any:
    sys.path.append(str(ROOT / "clients" / "python" / "tests"))
    from tbservers import Server

    return Server("redis-7.0", workdir, module=module).start()


@dataclass
class Row:
    """One backend at one concurrency: its RUNS runs, and each figure at
    its worst among them."""

    backend: str
    connections: int
    runs: list[Load]

    @property
    def req_per_s(self) -> float:
        return min(r.req_per_s for r in self.runs)

    @property
    def median_req_per_s(self) -> float:
        return sorted(r.req_per_s for r in self.runs)[len(self.runs) // 2]

    @property
    def p99_ms(self) -> float:
        return max(r.p99_ms for r in self.runs)

    @property
    def admitted_share(self) -> float:
        """The least admitted, as a share of that run's exact budget."""
        return min(r.admitted / r.budget for r in self.runs)

    @property
    def over_per_user(self) -> float:
        """The most admitted beyond the exact budget, in tokens per user."""
        return max((r.admitted - r.budget) / USERS for r in self.runs)

    @property
    def denied(self) -> int:
        return min(r.denied for r in self.runs)

    @property
    def shed(self) -> int:
        return max(r.shed + r.closed for r in self.runs)

    @property
    def degraded(self) -> int:
        return max(r.degraded for r in self.runs)

    @property
    def errors(self) -> int:
        return max(r.other + r.socket_errors for r in self.runs)

    @property
    def cpu_share(self) -> float:
        """The least CPU the workers got in a run, as a share of two cores."""
        return min(r.cpu_share for r in self.runs)

    @property
    def more_429s(self) -> bool:
        """429s outnumber 503s in every run (the users are over budget in all)."""
        return all(r.denied > r.shed + r.closed for r in self.runs)


def targets(row: Row, base: Row) -> list[tuple[str, bool]]:
    """Issue 37's targets for a row; `base` is the same backend at 200."""
    out = [
        ("admitted >= 0.95x budget", row.admitted_share >= 0.95),
        ("over by <= 1 token/user", row.over_per_user <= 1),
        ("429 > 503", row.more_429s),
        ("0 degraded", row.degraded == 0),
    ]
    if row is not base:
        out.insert(0, ("req/s >= 0.9x at 200", row.req_per_s >= 0.9 * base.req_per_s))
    return out


def report(rows: list[Row], seconds: int) -> str:
    import redis

    lines = [
        "",
        f"`make bench-gateway`, {time.strftime('%Y-%m-%d')}: `examples/fastapi-gateway` in 2 workers (serve.py: "
        f"uvicorn, a listening socket each), Redis 7.0 on loopback, redis-py {redis.__version__}; wrk, 2 threads, "
        f"{seconds} s per run, {USERS} saturated users (user bucket max {USER_MAX}, rate {USER_RATE:g}/s; the "
        "other buckets out of the way), `GET /v1/models` (fail-open). Each row is run "
        f"{RUNS} times and every column is its worst run's: the least req/s (the median in brackets), the "
        "longest p99, the least admitted as a share of that run's exact budget (users x (max + rate x "
        "seconds) over wrk's measured duration), the most tokens per user over it, the fewest 429s, the most "
        "503s; and the least CPU the two workers got in a run, as a share of two cores (what the machine's "
        "other work left them). The rows' runs are interleaved (200, 400, 1,000, then again), so a spell of "
        "other work on the machine falls on every row alike. Targets: req/s at 400 and 1,000 "
        "connections >= 0.9x req/s at 200; admitted >= "
        "0.95x the budget and never over it by more than one token per user; more 429s than 503s in every "
        "run (every user is over budget); 0 degraded while Redis is healthy. 2 cores shared by wrk, both "
        "workers and Redis: req/s are this machine's.",
        "",
        "| backend | connections | req/s | p99 ms | admitted / budget | over budget, tokens/user | 429 | 503 | "
        "degraded | errors | workers' CPU | targets |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for row in rows:
        base = next(r for r in rows if r.backend == row.backend and r.connections == 200)
        missed = [name for name, ok in targets(row, base) if not ok]
        ratio = "" if row is base else f", {row.req_per_s / base.req_per_s:.2f}x"
        lines.append(
            f"| {row.backend} | {row.connections:,} | {row.req_per_s:,.0f} ({row.median_req_per_s:,.0f}){ratio} | "
            f"{row.p99_ms:.0f} | {row.admitted_share:.3f} | {row.over_per_user:+.2f} | {row.denied:,} | "
            f"{row.shed:,} | {row.degraded:,} | {row.errors:,} | {row.cpu_share:.0%} | "
            f"{'PASS' if not missed else 'MISS: ' + ', '.join(missed)} |"
        )
    lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--report", type=Path, help="docs/benchmarks.md: replace or append the section")
    parser.add_argument("--seconds", type=int, default=15)
    parser.add_argument("--connections", default="200,400,1000")
    parser.add_argument("--runs", type=int, default=RUNS)
    args = parser.parse_args()
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as tmp:
        for backend, module in (("module", True), ("Lua library", False)):
            server = _server(module, Path(tmp) / backend.replace(" ", "-"))
            backend_rows = [Row(backend, int(c), []) for c in args.connections.split(",")]
            try:
                for _ in range(args.runs):
                    for row in backend_rows:
                        server.client().flushall()
                        r = run_load(server.url, row.connections, args.seconds)
                        print(f"{backend:12} c={row.connections:5} {r}", flush=True)
                        row.runs.append(r)
            finally:
                server.stop()
            rows.extend(backend_rows)
    text = report(rows, args.seconds)
    print(text)
    if args.report:
        write_section(args.report, "bench-gateway", text, "The gateway under load")


if __name__ == "__main__":
    main()
