"""The local denial cache.

A denial says "this request can't pass for the next R ms" (retry_after_ms
is the earliest millisecond at which it would). Until then the same
request, or a costlier one, on the same bucket is denied again, so this
process can answer it from memory: a client hammering a hot key in a retry
loop costs Redis one call per retry window instead of one per attempt.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Optional

from ._bucket import Bucket, KeyT
from ._decision import Decision

Keys = tuple[KeyT, ...]


@dataclass(frozen=True)
class _Entry:
    at: float  # clock() when the request was sent
    until: float  # clock() at which it may pass
    limits: tuple[tuple[float, float], ...]
    costs: tuple[float, ...]
    decisions: tuple[Decision, ...]


@dataclass(frozen=True)
class CachedDenial:
    retry_after_ms: int
    decisions: tuple[Decision, ...]


class DenialCache:
    """Requests known to be denied until some time, at most `max_entries`
    of them (least recently used go first).

    It never denies what Redis would admit, only later than Redis could:
    the deadline is counted from when the request was sent, not answered.
    It forgets a key when this process adjusts it (a refund may let the
    request pass sooner); a refund from another process is not seen, so
    such a request is denied at most until its original retry time.
    `clock` must be monotonic (seconds); tests pass a fake one.
    """

    def __init__(self, max_entries: int = 10_000, clock: Callable[[], float] = time.monotonic) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be >= 1")
        self.max_entries = max_entries
        self.clock = clock
        self.hits = 0
        self.misses = 0
        self._entries: OrderedDict[Keys, _Entry] = OrderedDict()
        self._by_key: dict[KeyT, set[Keys]] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, keys: Keys, buckets: Sequence[Bucket], costs: Sequence[float]) -> Optional[CachedDenial]:
        """The cached denial for this request, aged to now; None to ask Redis."""
        with self._lock:
            entry = self._entries.get(keys)
            if entry is None:
                self.misses += 1
                return None
            now = self.clock()
            if now >= entry.until:
                self._drop(keys)
                self.misses += 1
                return None
            # Another bucket size or a cheaper request may pass: ask Redis.
            if entry.limits != _limits(buckets) or any(c < old for c, old in zip(costs, entry.costs, strict=True)):
                self.misses += 1
                return None
            self._entries.move_to_end(keys)
            self.hits += 1
        elapsed_ms = (now - entry.at) * 1000
        return CachedDenial(
            max(1, math.ceil((entry.until - now) * 1000)),
            tuple(_aged(d, elapsed_ms) for d in entry.decisions),
        )

    def remember(self, sent_at: float, retry_after_ms: int, decisions: Sequence[Decision]) -> None:
        """Records a denial answered for a request sent at `sent_at`."""
        if retry_after_ms <= 0:
            return
        keys = tuple(d.key for d in decisions)
        entry = _Entry(
            sent_at,
            sent_at + retry_after_ms / 1000,
            _limits([d.bucket for d in decisions]),
            tuple(d.cost for d in decisions),
            tuple(decisions),
        )
        with self._lock:
            self._drop(keys)
            self._entries[keys] = entry
            for key in keys:
                self._by_key.setdefault(key, set()).add(keys)
            while len(self._entries) > self.max_entries:
                self._drop(next(iter(self._entries)))

    def forget(self, key: KeyT) -> None:
        """Drops every entry that involves `key`."""
        with self._lock:
            for keys in list(self._by_key.get(key, ())):
                self._drop(keys)

    def _drop(self, keys: Keys) -> None:
        if self._entries.pop(keys, None) is None:
            return
        for key in keys:
            owners = self._by_key.get(key)
            if owners is not None:
                owners.discard(keys)
                if not owners:
                    del self._by_key[key]


def _limits(buckets: Sequence[Bucket]) -> tuple[tuple[float, float], ...]:
    # The policy name doesn't change what passes.
    return tuple((b.max, b.rate) for b in buckets)


def _aged(d: Decision, elapsed_ms: float) -> Decision:
    retry = max(0, math.ceil(d.retry_after_ms - elapsed_ms)) if d.retry_after_ms else 0
    reset = max(retry, math.ceil(d.reset_after_ms - elapsed_ms))
    return replace(d, allowed=d.allowed or retry == 0, retry_after_ms=retry, reset_after_ms=reset, cached=True)
