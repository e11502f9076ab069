"""The gateway under wrk: uvicorn with 2 workers, N saturated users each
with a user bucket of max 20 and rate 2/s (the other buckets out of the
way), GET /v1/models (fail-open: the route a bypass would hurt most).

`run_load()` is shared by tests/test_overload.py (one admission count at
400 connections) and `make bench-gateway` (`python bench/gateway.py
--report ../../docs/benchmarks.md`: 200, 400 and 1,000 connections, on the
module and on the Lua library).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
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

HERE = Path(__file__).resolve().parent
EXAMPLE = HERE.parent
ROOT = EXAMPLE.parents[1]
USERS = 50
USER_MAX, USER_RATE = 20, 2.0
OUT_OF_THE_WAY = {"max": 1e9, "rate": 1e6}


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

    @property
    def budget(self) -> float:
        """What the users' buckets can admit over the run, exactly."""
        return USERS * (USER_MAX + USER_RATE * self.seconds)

    @property
    def req_per_s(self) -> float:
        return self.requests / self.seconds


def gateway_env(redis_url: str) -> dict[str, str]:
    keys = {
        hashlib.sha256(f"bench-key-{i}".encode()).hexdigest(): {"user_id": f"bench-{i}", "tier": "free"}
        for i in range(USERS)
    }
    limits = {
        "tiers": {"free": {"user": {"max": USER_MAX, "rate": USER_RATE}, "key": OUT_OF_THE_WAY, "llm": OUT_OF_THE_WAY}},
        "ip": OUT_OF_THE_WAY,
    }
    return {
        "GATEWAY_REDIS_URL": redis_url,
        "GATEWAY_API_KEYS": json.dumps(keys),
        "GATEWAY_LIMITS": json.dumps(limits),
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _wait_http(port: int, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"uvicorn exited: {log.read_text()[-2000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), 1) as s:
                s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                if b"200 OK" in s.recv(1024):
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError("uvicorn did not answer /healthz")


@contextmanager
def serve_gateway(env: dict[str, str], workers: int = 1) -> Iterator[int]:
    """The gateway under uvicorn, configured by `env` (GATEWAY_* variables),
    on a free port, which it yields; stopped on exit. Shared with the tests
    that need real HTTP (tests/test_streams.py)."""
    port = _free_port()
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "uvicorn.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "uvicorn", "app:app", "--workers", str(workers), "--port", str(port),
                 "--no-proxy-headers", "--no-access-log", "--log-level", "warning", "--backlog", "4096"],
                cwd=EXAMPLE, env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        try:
            _wait_http(port, proc, log)
            yield port
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def run_load(redis_url: str, connections: int, seconds: int, workers: int = 2) -> Load:
    """Starts the gateway, drives it with wrk, stops it; the answers counted."""
    wrk = shutil.which("wrk")
    if wrk is None:
        raise RuntimeError("wrk is missing: `make test-examples` or `make bench-gateway` installs it")
    with serve_gateway(gateway_env(redis_url), workers) as port:
        result = subprocess.run(
            [wrk, "-t2", f"-c{connections}", f"-d{seconds}s", "--timeout", "10s", "-s", str(HERE / "load.lua"),
             f"http://127.0.0.1:{port}", "--", str(USERS)],
            capture_output=True, text=True, timeout=seconds + 60,
        )  # fmt: skip
    line = re.search(r"^RESULT (.*)$", result.stdout, re.M)
    if line is None:
        raise RuntimeError(f"wrk gave no result: {result.stdout}\n{result.stderr}")
    f = {k: int(v) for k, v in (kv.split("=") for kv in line.group(1).split())}
    return Load(
        connections, f["duration_us"] / 1e6, f["requests"], f["p50_us"] / 1000, f["p99_us"] / 1000,
        f["admitted"], f["denied"], f["degraded"], f["shed"], f["closed"], f["other"], f["socket_errors"],
    )  # fmt: skip


# ---- make bench-gateway --------------------------------------------------------



def _server(module: bool, workdir: Path) -> Any:
    sys.path.append(str(ROOT / "clients" / "python" / "tests"))
    from tbservers import Server

    return Server("redis-7.0", workdir, module=module).start()


def report(rows: list[tuple[str, Load]], seconds: int) -> str:
    import redis

    lines = [
        "",
        f"`make bench-gateway`, {time.strftime('%Y-%m-%d')}: `examples/fastapi-gateway` under uvicorn with 2 workers, "
        f"Redis 7.0 on loopback, redis-py {redis.__version__}; wrk, 2 threads, {seconds} s per row, "
        f"{USERS} saturated users (user bucket max {USER_MAX}, rate {USER_RATE:g}/s; the other buckets out of "
        "the way), `GET /v1/models` (fail-open). The exact budget is users x (max + rate x seconds) over wrk's "
        "measured duration. Target (PASS): at most one token per user over the budget (no bypass), and 0 "
        "degraded while Redis is healthy; tests/test_overload.py asserts the same at 400 connections. Under the "
        "budget is no bypass: answers still in flight when wrk stops are not counted (about p50 x rate per "
        "user), and shed requests were refused tokens their users still had. 2 cores shared by wrk, both "
        "workers and Redis (and, in this run, other work): req/s are this machine's.",
        "",
        "| backend | connections | req/s | p50 ms | p99 ms | admitted | exact budget | admitted - budget | "
        "degraded | shed (503) | target |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for backend, r in rows:
        # Over the budget is a bypass. Under it is not: answers still in
        # flight when wrk stops are not counted (about p50 x rate tokens a
        # user), and shed requests were refused tokens their users had.
        ok = r.admitted <= r.budget + USERS and r.degraded == 0
        lines.append(
            f"| {backend} | {r.connections:,} | {r.req_per_s:,.0f} | {r.p50_ms:.1f} | {r.p99_ms:.1f} | "
            f"{r.admitted:,} | {r.budget:,.0f} | {r.admitted - r.budget:+,.0f} | {r.degraded:,} | {r.shed:,} | "
            f"{'PASS' if ok else 'MISS'} |"
        )
    lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--report", type=Path, help="docs/benchmarks.md: replace or append the section")
    parser.add_argument("--seconds", type=int, default=15)
    parser.add_argument("--connections", default="200,400,1000")
    args = parser.parse_args()
    rows: list[tuple[str, Load]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for backend, module in (("module", True), ("Lua library", False)):
            server = _server(module, Path(tmp) / backend.replace(" ", "-"))
            try:
                for c in (int(x) for x in args.connections.split(",")):
                    server.client().flushall()
                    r = run_load(server.url, c, args.seconds)
                    print(f"{backend:12} c={c:5} {r}", flush=True)
                    rows.append((backend, r))
            finally:
                server.stop()
    text = report(rows, args.seconds)
    print(text)
    if args.report:
        write_section(args.report, "bench-gateway", text, "The gateway under load (issue 26)")


if __name__ == "__main__":
    main()
