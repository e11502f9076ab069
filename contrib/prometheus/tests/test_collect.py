"""tb-collect.lua run as redis_exporter runs it (EVAL, no keys), straight
against each server of the matrix, with and without the module.

The exporter 1.45 reports redis_up 0 when its script fails or returns a
value it can't parse as a float; so the script must answer, with strings
of plain numbers only, on every server."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from promstack import COLLECT_SCRIPT, Server, raw_info

# The fields src/stats.rs defines today. The script has no list of its own:
# the comparison below is with every numeric tb_* field INFO tb shows, so
# fields added later are checked without a change here.
KNOWN_FIELDS = {"tb_admitted", "tb_denied", "tb_peeks", "tb_adjusts", "tb_errors", "tb_panics"}
# A refill so slow that no test lives long enough to see a token back.
SLOW = 0.001
# What the exporter's float parsing (Go's strconv.ParseFloat) takes and
# Lua's tonumber would also take: plain decimals, no hex, no inf/nan.
PLAIN_NUMBER = re.compile(r"-?[0-9]+(\.[0-9]+)?")

MODULE_SERVERS = ["redis-7.0", "redis-8.2", "valkey-9.1"]
PLAIN_SERVERS = ["redis-7.0", "redis-8.2", "valkey-9.1", "redis-6.2"]


@pytest.fixture
def server_of(tmp_path: Path) -> Iterator[Any]:
    started: list[Server] = []

    def start(kind: str, module: bool) -> Server:
        server = Server(kind, tmp_path / f"{kind}{'+module' if module else ''}", module=module).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def collect(client: redis.Redis) -> list[str]:
    """The script's reply, as the exporter sends it: EVAL <script> 0."""
    reply = client.eval(COLLECT_SCRIPT.read_text(), 0)
    assert isinstance(reply, list)
    return [item.decode() if isinstance(item, bytes) else str(item) for item in reply]


def numeric_tb_fields(client: redis.Redis) -> dict[str, str]:
    """Every tb_* field of INFO tb whose value is a number, as INFO prints it."""
    raw = raw_info(client, "tb")
    fields = dict(line.split(":", 1) for line in raw.splitlines() if line.startswith("tb_"))
    return {name: value for name, value in fields.items() if PLAIN_NUMBER.fullmatch(value)}


@pytest.mark.parametrize("kind", MODULE_SERVERS)
def test_every_numeric_tb_field_of_info_tb_and_nothing_else(server_of: Any, kind: str) -> None:
    server = server_of(kind, module=True)
    with server.client() as c:
        for _ in range(3):
            c.execute_command("TB.CONSUME", "rl:a", 2, SLOW)  # 2 admitted, 1 denied
        c.execute_command("TB.PEEK", "rl:a", 2, SLOW)
        with pytest.raises(redis.ResponseError):
            c.execute_command("TB.CONSUME", "rl:a", 2, "fast")
        reply = collect(c)
        expected = numeric_tb_fields(c)
        info = raw_info(c, "tb")

    assert len(reply) % 2 == 0, reply
    exported = dict(zip(reply[::2], reply[1::2], strict=True))
    assert len(exported) == len(reply) // 2, f"a field twice: {reply}"
    assert exported == expected
    assert exported.keys() >= KNOWN_FIELDS
    counts = {k: exported[k] for k in ("tb_admitted", "tb_denied", "tb_peeks", "tb_errors")}
    assert counts == {"tb_admitted": "2", "tb_denied": "1", "tb_peeks": "1", "tb_errors": "1"}
    # tb_version (0.1.0) is in INFO tb but not a number: left out, since the
    # exporter would fail the scrape on it.
    assert "tb_version:" in info and "tb_version" not in exported
    assert all(PLAIN_NUMBER.fullmatch(v) for v in exported.values())


@pytest.mark.parametrize("kind", PLAIN_SERVERS)
def test_without_the_module_the_script_answers_an_empty_list(server_of: Any, kind: str) -> None:
    server = server_of(kind, module=False)
    with server.client() as c:
        assert raw_info(c, "tb").strip() == ""
        assert collect(c) == []


def test_the_script_answers_when_redis_is_out_of_memory(server_of: Any) -> None:
    # Under OOM with noeviction, writes fail; the script only reads, and
    # Prometheus must keep seeing the counters then most of all.
    server = server_of("redis-7.0", module=True)
    with server.client() as c:
        c.execute_command("TB.CONSUME", "rl:a", 2, SLOW)
        c.config_set("maxmemory-policy", "noeviction")
        c.config_set("maxmemory", 1)
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            c.execute_command("TB.CONSUME", "rl:b", 2, SLOW)
        reply = collect(c)
        exported = dict(zip(reply[::2], reply[1::2], strict=True))
        assert exported["tb_admitted"] == "1"
