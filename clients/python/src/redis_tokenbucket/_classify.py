"""What an error means for the failure policy (docs/failure-model.md):
Redis failing, this process out of something (shed), or a usage error."""

from __future__ import annotations

import asyncio
import errno
import re
from typing import Literal, Optional

from redis.exceptions import (
    AuthenticationError,
    AuthorizationError,
    BusyLoadingError,
    ClusterError,
    ConnectionError,
    ReadOnlyError,
    RedisClusterException,
    ResponseError,
)
from redis.exceptions import TimeoutError as RedisTimeoutError

from ._contract import LOCAL_EXHAUSTION as LOCAL_EXHAUSTION_NAMES
from ._contract import UNAVAILABLE_REPLIES
from ._errors import NoBackendError, Shed

Kind = Literal["failure", "shed", "usage"]

# Error replies that say the server can't serve now (a failover, a restart,
# a script that runs too long, a full memory, a snapshot that failed, too
# few replicas for min-replicas-to-write, a slot moving), as opposed to
# "your request is wrong": contract.json's, shared by every client.
# redis-py turns some into their own classes and drops the code
# (UNAVAILABLE_REPLIES, below).
_POOL_EXHAUSTED = ("too many connections", "no connection available")

# This process or host out of a resource (contract.json's errno names):
# descriptors (its own, the system's), local ports, socket buffers, memory.
# Redis is not at fault and may be fine, so none of these may fail open or
# count for the breaker.
LOCAL_EXHAUSTION = frozenset(getattr(errno, name) for name in LOCAL_EXHAUSTION_NAMES)
# How redis-py words an OSError it wraps in its ConnectionError: "Error 24
# connecting to host:6379. Too many open files.", "Error 105 while writing
# to socket. ...", "Error while reading from host:6379 : (24, '...')".
_WRAPPED_ERRNO = re.compile(r"\bError (\d+) (?:connecting|while writing)|: \((\d+), ")


def local_errno(exc: BaseException) -> Optional[int]:
    """The errno of local exhaustion behind `exc`, raw or wrapped (in its
    cause or context, or in the text redis-py made of it); None if none."""
    seen: set[int] = set()
    current: Optional[BaseException] = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in LOCAL_EXHAUSTION:
            return current.errno
        if isinstance(current, (ConnectionError, OSError, RedisClusterException)):
            match = _WRAPPED_ERRNO.search(str(current))
            if match is not None:
                number = int(match.group(1) or match.group(2))
                if number in LOCAL_EXHAUSTION:
                    return number
        current = current.__cause__ or current.__context__
    return None


def classify(exc: BaseException) -> Kind:
    """What an error means for the failure policy: Redis failing
    ("failure"), this process unable to get Redis's answer, overloaded or
    out of a local resource ("shed"), or a usage error that always raises
    ("usage": a bad argument, a key of the wrong type, a server that
    refuses the user, which no policy should hide)."""
    if isinstance(exc, Shed):
        return "shed"
    if isinstance(exc, (AuthenticationError, AuthorizationError, NoBackendError)):
        return "usage"
    if not isinstance(exc, ResponseError) and local_errno(exc) is not None:
        return "shed"
    if isinstance(exc, ConnectionError):
        # redis-py's pool running out (MaxConnectionsError in redis-py 6+,
        # a plain ConnectionError before) is back-pressure, not an outage.
        text = str(exc).lower()
        if type(exc).__name__ == "MaxConnectionsError" or any(t in text for t in _POOL_EXHAUSTED):
            return "shed"
        return "failure"
    if isinstance(exc, (RedisTimeoutError, TimeoutError, asyncio.TimeoutError, BusyLoadingError, ReadOnlyError)):
        return "failure"
    if isinstance(exc, ClusterError):
        # "TTL exhausted.": TRYAGAIN, ASK or MOVED retried until redis-py
        # gave up, a reshard or a failover under way.
        return "failure"
    if isinstance(exc, ResponseError):
        name = type(exc).__name__
        # AskError: a slot mid-migration, its redirects not followed to the end.
        if name in ("ClusterDownError", "MasterDownError", "TryAgainError", "OutOfMemoryError", "AskError"):
            return "failure"
        text = str(exc)
        return "failure" if text.startswith(UNAVAILABLE_REPLIES) else "usage"
    if isinstance(exc, RedisClusterException):
        # No node reachable, no slot map: the cluster is not serving.
        return "failure"
    if isinstance(exc, OSError):
        return "failure"
    return "usage"  # DataError, TypeError, ValueError, ...: the caller's
