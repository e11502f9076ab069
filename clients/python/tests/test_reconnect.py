"""A connection the server closed while it sat idle is not an outage:
Redis's own `timeout`, CLIENT KILL, a load balancer's idle
cut. The next call goes on a new connection and gets Redis's own answer;
the breaker, which one failure would open here, stays closed. A charge
may go twice (it only charges twice); a refund goes again only where it
provably never reached Redis."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis
import redis.asyncio
from conftest import SLOW, Target, run
from tbservers import Server

import redis_tokenbucket.asyncio as tb_asyncio
from redis_tokenbucket import Breaker, Bucket, Decision, Limiter

B = Bucket(10, SLOW, name="user")


def strict() -> Breaker:
    return Breaker(1, 10, 2)  # one Redis failure opens it


def answers(decisions: list[Decision]) -> list[tuple[bool, int, bool, bool]]:
    return [(d.allowed, d.remaining, d.degraded, d.shed) for d in decisions]


# Each call between two closes: consume, refund, peek, consume_many.
def expected() -> list[tuple[bool, int, bool, bool]]:
    return [(True, 9, False, False), (True, 8, False, False), (True, 9, False, False), (True, 9, False, False),
            (True, 8, False, False), (True, 9, False, False)]  # fmt: skip


def sync_calls(lim: Limiter, close: Callable[[], None]) -> list[Decision]:
    out = [lim.consume("rl:idle", B)]
    close()
    out.append(lim.consume("rl:idle", B))
    close()
    out.append(lim.adjust("rl:idle", B, 1))  # a refund, on a connection closed before it is sent
    close()
    out.append(lim.peek("rl:idle", B))
    close()
    many = lim.consume_many([("rl:idle", B), ("rl:idle2", B)])
    out.extend(many.decisions)
    return out


async def async_calls(lim: tb_asyncio.Limiter, close: Callable[[], Any]) -> list[Decision]:
    out = [await lim.consume("rl:idle", B)]
    await close()
    out.append(await lim.consume("rl:idle", B))
    await close()
    out.append(await lim.adjust("rl:idle", B, 1))
    await close()
    out.append(await lim.peek("rl:idle", B))
    await close()
    many = await lim.consume_many([("rl:idle", B), ("rl:idle2", B)])
    out.extend(many.decisions)
    return out


def kill_clients(target: Target) -> None:
    with target.admin() as admin:
        assert admin.client_kill_filter(_type="normal", skip_me=True) >= 1


def connections_received(target: Any) -> int:
    with redis.Redis(port=target.port) as admin:
        return int(admin.info("stats")["total_connections_received"])


@pytest.mark.parametrize("flavour", ["sync", "asyncio"])
def test_client_kill_between_calls_is_not_an_outage(module_target: Target, flavour: str):
    def close() -> None:
        kill_clients(module_target)

    if flavour == "sync":
        lim = Limiter(module_target.client(), on_error="open", breaker=strict())
        out, state = sync_calls(lim, close), lim.breaker_state
        lim.close()
    else:

        async def main() -> tuple[list[Decision], str]:
            async def aclose() -> None:
                close()  # at once: the loop has not heard of it yet

            async with tb_asyncio.Limiter(module_target.async_client(), on_error="open", breaker=strict()) as alim:
                return await async_calls(alim, aclose), alim.breaker_state

        out, state = run(main())
    assert answers(out) == expected()
    assert state == "closed"


@pytest.mark.parametrize("flavour", ["sync", "asyncio"])
def test_the_servers_idle_timeout_is_not_an_outage(own_server: Server, flavour: str):
    """Redis's `timeout 1`: a connection idle for more than a second is
    closed by the server (its cron: 2.5 s is past it whatever the clock's
    fraction). Each call after such a pause gets Redis's own answer."""
    own_server.client().config_set("timeout", 1)
    pause = 2.5
    before = connections_received(own_server)

    if flavour == "sync":
        lim = Limiter(own_server.client(), on_error="open", breaker=strict())
        out, state = sync_calls(lim, lambda: time.sleep(pause)), lim.breaker_state
        lim.close()
    else:

        async def main() -> tuple[list[Decision], str]:
            client = redis.asyncio.Redis(port=own_server.port)
            async with tb_asyncio.Limiter(client, on_error="open", breaker=strict()) as alim:
                return await async_calls(alim, lambda: asyncio.sleep(pause)), alim.breaker_state

        out, state = run(main())
    assert answers(out) == expected()
    assert state == "closed"
    # One connection to start with and one after each pause (each pause
    # closed one), and the count's own.
    assert connections_received(own_server) - before == 5 + 1


def test_a_charge_on_a_connection_closed_under_it_goes_once_more_sync(own_server: Server):
    """The sync limiter writes a charge on a connection the server has
    closed (EOF waiting in the socket, unread): it reads the EOF where the
    reply should be, and sends the charge once more on a new connection."""
    lim = Limiter(own_server.client(), on_error="open", breaker=strict())
    assert lim.consume("rl:kill", B).remaining == 9
    with own_server.client() as admin:
        assert admin.client_kill_filter(_type="normal", skip_me=True) == 1
        d = lim.consume("rl:kill", B)
        assert (d.allowed, d.remaining, d.degraded) == (True, 8, False)
        assert lim.breaker_state == "closed"
        # The refund is found closed before it is written: sent on a new one.
        assert admin.client_kill_filter(_type="normal", skip_me=True) == 1
        d = lim.adjust("rl:kill", B, 2)
        assert (d.remaining, d.degraded) == (10, False)
    lim.close()
