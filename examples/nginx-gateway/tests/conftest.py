"""The nginx gateway example as a user runs it (run.sh, 2 workers), on
real redis-servers: Redis 7.0 with the module and without it (the Lua
library). The same tiny limits and test keys as the FastAPI example's
tests, so both gateways answer alike."""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.append(str(ROOT / "clients" / "openresty" / "test" / "nginx"))
sys.path.append(str(ROOT / "clients" / "python" / "tests"))
from nginxkit import Gateway  # noqa: E402
from tbservers import Server  # noqa: E402

# `server` (Redis 7.0 with the module, and without it) and `r`, shared.
pytest_plugins = ["redis_fixtures"]

# Refill so slow that no test lives long enough to see a whole token back.
SLOW = 0.001


def bucket(max_: float, rate: float = SLOW) -> dict[str, float]:
    return {"max": max_, "rate": rate}


LIMITS = {
    "tiers": {
        "free": {"user": bucket(3), "key": bucket(5), "llm": bucket(100), "streams": 2},
        "standard": {"user": bucket(4), "key": bucket(6), "llm": bucket(1000), "streams": 3},
    },
    "ip": bucket(50),
    # Far longer than any test: only a release frees a stream's slot in time.
    "stream_lease_ms": 60_000,
}

PRINCIPALS = {
    "k-free": {"user_id": "u-free", "tier": "free"},
    "k-free2": {"user_id": "u-free2", "tier": "free"},
    "k-std": {"user_id": "u-std", "tier": "standard"},
    "k-gold": {"user_id": "u-gold", "tier": "gold"},  # unknown tier: free
}


def key_id(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


API_KEYS = {key_id(k): p for k, p in PRINCIPALS.items()}


def auth(key: str) -> dict[str, str]:
    return {"X-API-Key": key}


def env(url: str, **more: Any) -> dict[str, str]:
    out = {
        "GATEWAY_REDIS_URL": url,
        "GATEWAY_API_KEYS": json.dumps(API_KEYS),
        "GATEWAY_LIMITS": json.dumps(more.pop("limits", LIMITS)),
    }
    out.update({f"GATEWAY_{k.upper()}": str(v) for k, v in more.items()})
    return out


@pytest.fixture
def gateway(server: Server) -> Iterator[Callable[..., Gateway]]:
    """Starts gateways on `server` (GATEWAY_* settings as keywords); all
    are stopped at the end of the test, and none may have logged a Lua
    error or lost a worker."""
    started: list[Gateway] = []

    def start(url: str = "", **settings: Any) -> Gateway:
        g = Gateway(env(url or server.url, **settings))
        started.append(g)
        return g.start()

    yield start
    for g in started:
        g.stop()
        log = g.log.read_text(errors="replace")
        g.cleanup()
        for bad in ("stack traceback", "runtime error", "exited on signal", "lua entry thread aborted"):
            assert bad not in log, log[-3000:]
