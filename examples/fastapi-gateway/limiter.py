"""Token buckets in Redis: the TB.* module when the server has it, else the
Lua Functions library lua/tb.lua, behind one interface.

The two backends differ only in how a call is spelled; the replies are the
same (docs/commands.md), so everything above `Backend.call` is shared.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, replace
from itertools import chain
from pathlib import Path
from typing import Sequence

from redis.asyncio import Redis, RedisCluster
from redis.exceptions import RedisClusterException, RedisError

from config import TokenBucket

log = logging.getLogger("gateway.limiter")

# Read-only probe for the backend detection; under `rl:` like every bucket,
# so an ACL key pattern `~rl:*` covers it.
PROBE = ("rl:probe", 1, 1)


class LimiterUnavailable(Exception):
    """Redis is unreachable, or answers neither TB.* nor the Lua library.
    Routes map it to their fail-open or fail-closed policy."""


@dataclass(frozen=True)
class Dimension:
    """One bucket a request is charged against."""

    name: str  # policy name in the RateLimit headers: user, key, ip, llm
    key: str
    bucket: TokenBucket
    cost: float = 1


@dataclass(frozen=True)
class BucketState:
    """One bucket's [allowed, remaining, retry_after_ms, reset_after_ms]."""

    dim: Dimension
    allowed: bool
    remaining: int
    retry_ms: int
    reset_ms: int

    @property
    def wait_ms(self) -> int:
        """Until this bucket matters again: its retry time if it denies,
        else the time until it is full."""
        return self.reset_ms if self.allowed else self.retry_ms


@dataclass(frozen=True)
class Decision:
    allowed: bool
    retry_ms: int  # the worst bucket's: waiting this long lets all of them pass
    states: tuple[BucketState, ...]

    @property
    def retry_after(self) -> int:
        """Retry-After in whole seconds, rounded up, so a retry then passes."""
        return -(-self.retry_ms // 1000)

    @property
    def tightest(self) -> BucketState:
        """The most restrictive bucket: a denying one with the longest wait,
        else the one with the smallest share of its capacity left."""
        return max(
            self.states,
            key=lambda s: (not s.allowed, s.retry_ms, -s.remaining / s.dim.bucket.max),
        )


def _state(dim: Dimension, reply: Sequence[int]) -> BucketState:
    allowed, remaining, retry_ms, reset_ms = reply
    return BucketState(dim, bool(allowed), remaining, retry_ms, reset_ms)


def _missing(exc: RedisError) -> bool:
    """The server lacks the command (no module) or the function (library not
    loaded, or flushed since). A cluster client says so itself, from the
    server's COMMAND table, before sending anything."""
    text = str(exc).lower()
    return any(m in text for m in ("unknown command", "function not found", "doesn't exist in redis commands"))


class Backend:
    """How one TB operation is sent. `groups` are (key, max, rate, n) tuples,
    n being the cost or the delta."""

    name: str

    def __init__(self, redis: Redis | RedisCluster) -> None:
        self.redis = redis

    async def call(self, op: str, groups: Sequence[tuple]) -> list:
        raise NotImplementedError


class ModuleBackend(Backend):
    name = "module"

    async def call(self, op: str, groups: Sequence[tuple]) -> list:
        # TB.MCONSUME key max rate cost [key max rate cost ...]
        return await self.redis.execute_command(f"TB.{op.upper()}", *chain.from_iterable(groups))


class LuaBackend(Backend):
    name = "lua"

    async def call(self, op: str, groups: Sequence[tuple]) -> list:
        # FCALL tb_mconsume N key1..keyN max1 rate1 cost1 ...: keys first.
        keys = [g[0] for g in groups]
        args = [a for g in groups for a in g[1:]]
        fcall = "FCALL_RO" if op == "peek" else "FCALL"  # FCALL_RO runs on replicas
        return await self.redis.execute_command(fcall, f"tb_{op}", len(keys), *keys, *args)


class Limiter:
    def __init__(self, redis: Redis | RedisCluster, lua_path: Path, cluster_mode: bool = False) -> None:
        self.redis = redis
        self.lua_path = lua_path
        self.cluster_mode = cluster_mode
        self.backend: Backend | None = None  # detected on first use

    # ---- backend detection ------------------------------------------------

    async def _detect(self) -> Backend:
        module = ModuleBackend(self.redis)
        try:
            await module.call("peek", [PROBE])
            return module
        except RedisError as exc:
            if not _missing(exc):
                raise
        lua = LuaBackend(self.redis)
        try:
            await lua.call("peek", [PROBE])
        except RedisError as exc:
            if not _missing(exc):
                raise
            # REPLACE makes the load idempotent: two gateways racing, or a
            # cluster where some primaries have it and some don't.
            await self.redis.function_load(self.lua_path.read_text(), replace=True)
            await lua.call("peek", [PROBE])
        log.warning("TB.* commands unavailable: using the Lua library (%s)", self.lua_path)
        return lua

    async def _call(self, op: str, groups: Sequence[tuple]) -> list:
        try:
            if self.backend is None:
                self.backend = await self._detect()
            try:
                return await self.backend.call(op, groups)
            except RedisError as exc:
                if not _missing(exc):
                    raise
                # A failover to a server without the module, or FUNCTION
                # FLUSH: detect again and retry once.
                self.backend = await self._detect()
                return await self.backend.call(op, groups)
        except (RedisError, RedisClusterException, OSError) as exc:  # OSError: the Lua file
            raise LimiterUnavailable(f"{type(exc).__name__}: {exc}") from exc

    async def ready(self) -> str:
        """Name of the answering backend; raises LimiterUnavailable."""
        await self._call("peek", [PROBE])
        assert self.backend is not None
        return self.backend.name

    # ---- operations -------------------------------------------------------

    @staticmethod
    def _group(dim: Dimension, n: float) -> tuple:
        return (dim.key, dim.bucket.max, dim.bucket.rate, n)

    async def consume(self, dim: Dimension) -> BucketState:
        return _state(dim, await self._call("consume", [self._group(dim, dim.cost)]))

    async def peek(self, dim: Dimension) -> BucketState:
        return _state(dim, await self._call("peek", [self._group(dim, dim.cost)]))

    async def adjust(self, dim: Dimension, delta: float) -> BucketState:
        """Refund (delta > 0) or charge after the fact (delta < 0, may go
        into debt down to -max)."""
        return _state(dim, await self._call("adjust", [self._group(dim, delta)]))

    async def check(self, dims: Sequence[Dimension]) -> Decision:
        """Charges every bucket or none."""
        if self.cluster_mode:
            return await self._check_each(dims)
        allowed, retry_ms, *replies = await self._call("mconsume", [self._group(d, d.cost) for d in dims])
        return Decision(bool(allowed), retry_ms, tuple(map(_state, dims, replies)))

    async def _check_each(self, dims: Sequence[Dimension]) -> Decision:
        """All-or-nothing without TB.MCONSUME, for keys in different Cluster
        slots: charge bucket by bucket; when one denies, refund those
        already charged and peek at the rest, so the answer is the one
        TB.MCONSUME would give. Unlike TB.MCONSUME it is not atomic: for a
        moment the refunded tokens are missing, and a concurrent request
        can be denied for it."""
        charged: list[BucketState] = []
        for i, dim in enumerate(dims):
            state = await self.consume(dim)
            if state.allowed:
                charged.append(state)
                continue
            rest = await asyncio.gather(
                *(self.adjust(c.dim, c.dim.cost) for c in charged),
                *(self.peek(d) for d in dims[i + 1 :]),
            )
            # A refunded bucket could pay on its own, as in TB.MCONSUME's
            # reply; ADJUST's retry (for cost 1) means nothing here.
            refunded = [replace(s, allowed=True, retry_ms=0) for s in rest[: len(charged)]]
            states = (*refunded, state, *rest[len(charged) :])
            return Decision(False, max(s.retry_ms for s in states), states)
        return Decision(True, 0, tuple(charged))
