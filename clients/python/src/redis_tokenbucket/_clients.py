"""Which redis-py clients a limiter can drive."""

from __future__ import annotations

import inspect
from typing import Any

import redis
import redis.asyncio
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster

BLOCKING = (redis.Redis, RedisCluster)
ASYNCIO = (redis.asyncio.Redis, AsyncRedisCluster)


def is_asyncio(client: Any) -> bool:
    """Whether the client's calls are awaited: redis.asyncio's clients (and
    their subclasses, such as fakeredis's), or any client whose
    `execute_command` is a coroutine function."""
    if isinstance(client, ASYNCIO):
        return True
    if isinstance(client, BLOCKING):
        return False
    return inspect.iscoroutinefunction(getattr(client, "execute_command", None))


def check_client(client: Any, asyncio: bool) -> None:
    """Refuses, before any call, a client the limiter can't drive: one
    without `execute_command`, or a blocking client for the asyncio
    Limiter and an asyncio one for the blocking Limiter."""
    if not callable(getattr(client, "execute_command", None)):
        raise TypeError(f"expected a redis-py client, got {type(client).__name__}")
    if is_asyncio(client) == asyncio:
        return
    name = f"{type(client).__module__}.{type(client).__qualname__}"
    if asyncio:
        raise TypeError(
            f"redis_tokenbucket.asyncio.Limiter needs an asyncio client (redis.asyncio.Redis or "
            f"redis.asyncio.RedisCluster), got {name}: use redis_tokenbucket.Limiter for a blocking one"
        )
    raise TypeError(
        f"redis_tokenbucket.Limiter needs a blocking client (redis.Redis or redis.cluster.RedisCluster), "
        f"got {name}: use redis_tokenbucket.asyncio.Limiter for an asyncio one"
    )
