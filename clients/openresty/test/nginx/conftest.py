"""The module under real nginx (2 workers) on Redis 7.0: with the module,
and without it (the Lua library, loaded by the limiter). Servers come from
the Python package's test kit (clients/python/tests/tbservers.py), nginx
from nginxkit.py; every one is on a free loopback port and stopped after."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
sys.path.append(str(HERE))
sys.path.append(str(HERE.parents[2] / "python" / "tests"))
from nginxkit import Nginx, Response, request  # noqa: E402

# `server` (Redis 7.0 with the module, and without it) and `r`, shared.
pytest_plugins = ["redis_fixtures"]

# Refill so slow that no test lives long enough to see a whole token back.
SLOW = 0.001

# A location limited by `limit` (the global the init block makes), that
# answers with the worker that served it.
LIMITED = """
        location = /limited {
            access_by_lua_block { ngx.header["X-Worker"] = ngx.worker.pid(); limit:access() }
            content_by_lua_block { ngx.say("ok") }
        }
        location = /state {
            content_by_lua_block { ngx.say(limit.limiter:breaker_state()) }
        }
        location = /ready {
            content_by_lua_block {
                local s = limit:ready()
                ngx.say(s.ready and s.backend or ("unready: " .. s.reason))
            }
        }
"""


def lua_config(url: str, **options: Any) -> str:
    """A limits table as Lua source, from Python values (rules as strings
    of Lua, so they may hold functions)."""
    rules = options.pop("rules", None)
    concurrency = options.pop("concurrency", None)
    parts = [f"redis = {lua(url)}", 'shared_dict = "tokenbucket"']
    parts += [f"{k} = {lua(v)}" for k, v in options.items()]
    if rules is not None:
        parts.append("rules = {" + ", ".join(rules) + "}")
    if concurrency is not None:
        parts.append(f"concurrency = {concurrency}")
    return "{\n  " + ",\n  ".join(parts) + "\n}"


def lua(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {lua(v)}" for k, v in value.items()) + "}"
    raise TypeError(value)


def one_limiter(url: str, **options: Any) -> str:
    return f'limit = require("resty.tokenbucket").new({lua_config(url, **options)})'


@pytest.fixture
def nginx() -> Iterator[Callable[..., Nginx]]:
    """Starts nginx instances; all are stopped at the end of the test."""
    started: list[Nginx] = []

    def start(init: str, locations: str = LIMITED, **kwargs: Any) -> Nginx:
        n = Nginx(init, locations, **kwargs)
        started.append(n)
        return n.start()

    yield start
    for n in started:
        ran = n.proc is not None and n.proc.poll() is None  # not one that failed to start
        n.stop()
        log = n.error_log.read_text(errors="replace")
        n.cleanup()
        # No Lua error escaped the module, and no worker died.
        for bad in ("stack traceback", "runtime error", "exited on signal", "lua entry thread aborted"):
            assert not ran or bad not in log, log[-3000:]


def burst(port_paths: list[tuple[int, str]], headers: dict[str, str], threads: int = 16) -> list[Response]:
    """Sends every (port, path) at once, each on a connection of its own."""
    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(lambda pp: request(pp[0], "GET", pp[1], headers), port_paths))
