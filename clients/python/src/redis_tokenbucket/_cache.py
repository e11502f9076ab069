"""The local denial cache.

A denial says "this request can't pass for the next R ms" (retry_after_ms
is the earliest millisecond at which it would). Until then the same
request, or a costlier one, on the same bucket is denied again, so this
process can answer it from memory: a client hammering a hot key in a retry
loop costs Redis one call per retry window instead of one per attempt.
"""

from __future__ import annotations

import math
import operator
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Optional, Union

from ._decision import Decision
from ._keys import KeyT, key_bytes
from ._quota import Rule

Ids = tuple[bytes, ...]

DEFAULT_ENTRIES = 10_000

CacheOp = Literal["consume", "peek", "adjust", "mconsume", "each", "reset", "acquire"]
"""What a request does, as far as the cache cares: `each` is a consume_many
charged bucket by bucket (refunded on a denial), `reset` deletes the key,
`acquire` charges its buckets with a lease (its denial is never kept: a
release can free a slot at any time)."""


@dataclass(frozen=True)
class _Entry:
    at: float  # clock() when the request was sent
    until: float  # clock() at which it may pass
    limits: tuple[tuple[Any, ...], ...]
    costs: tuple[float, ...]
    decisions: tuple[Decision, ...]


@dataclass(frozen=True)
class CachedDenial:
    retry_after_ms: int
    decisions: tuple[Decision, ...]


class Ticket:
    """A request on its way to Redis: its keys, when it was sent, and
    whether a write to one of its keys finished while it was in flight (its
    answer may then predate that write, and is not remembered). Closed by
    `answered` or `failed`."""

    __slots__ = ("cache", "ids", "op", "sent_at", "stale")

    def __init__(self, cache: DenialCache, op: CacheOp, ids: Ids, sent_at: float) -> None:
        self.cache, self.op, self.ids, self.sent_at = cache, op, ids, sent_at
        self.stale = False

    def answered(self, allowed: bool, retry_after_ms: int, decisions: Sequence[Decision]) -> None:
        self.cache.answered(self, allowed, retry_after_ms, decisions)

    def failed(self) -> None:
        self.cache.failed(self)


class DenialCache:
    """Requests known to be denied until some time, at most `max_entries`
    of them (least recently used go first).

    It never denies what Redis would admit, only later than Redis could:
    the deadline is counted from when the request was sent, not answered.
    Any write this process makes to a key (a charge, a refund, a reset)
    drops the entries that involve it, and a denial whose request was in
    flight while such a write finished is not remembered (Redis may have
    answered it before the write). A refund from another process is not
    seen, so such a request is denied at most until its original retry time.

    Keys are compared as the bytes Redis sees (`7`, `"7"` and `b"7"` are one
    key), str keys encoded as the limiter's client encodes them. `clock`
    must be monotonic (seconds); tests pass a fake one.
    """

    def __init__(
        self, max_entries: int = DEFAULT_ENTRIES, clock: Callable[[], float] = time.monotonic, *, encoding: str = ""
    ) -> None:
        if not isinstance(max_entries, int) or isinstance(max_entries, bool):
            raise TypeError(f"max_entries must be an int, got {type(max_entries).__name__}")
        if max_entries < 1:
            raise ValueError("max_entries must be >= 1")
        self.max_entries = max_entries
        self.clock = clock
        # Set by the first limiter that uses the cache (its client's), if not given.
        self.encoding = encoding
        self.hits = 0
        self.misses = 0
        self._entries: OrderedDict[Ids, _Entry] = OrderedDict()
        self._by_key: dict[bytes, set[Ids]] = {}
        self._pending: dict[bytes, set[Ticket]] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def _ids(self, keys: Sequence[KeyT]) -> Ids:
        encoding = self.encoding or "utf-8"
        return tuple(key_bytes(k, encoding) for k in keys)

    def lookup(self, keys: Sequence[KeyT], buckets: Sequence[Rule], costs: Sequence[float]) -> Optional[CachedDenial]:
        """The cached denial for this request, aged to now; None to ask Redis."""
        found = self._find(self._ids(keys), _limits(buckets), costs)
        if found is None:
            return None
        entry, now = found
        # Rounded to the µs, as the retry time below: a float clock's noise
        # must not add a millisecond to an aged wait.
        elapsed_ms = round((now - entry.at) * 1000, 3)
        # Rounded to the µs first: `until` is a sum of floats, and the noise
        # of (at + retry) - at must not round a whole ms up.
        return CachedDenial(
            max(1, math.ceil(round((entry.until - now) * 1000, 3))),
            tuple(_aged(d, elapsed_ms) for d in entry.decisions),
        )

    def lookup_one(self, key: KeyT, bucket: Rule, cost: float) -> Optional[Decision]:
        """`lookup` of a one-bucket request, as its aged Decision: the path a
        client in a retry loop takes on every try, so no tuple is built
        that one key doesn't need."""
        found = self._find((key_bytes(key, self.encoding or "utf-8"),), (bucket._ident,), (cost,))
        if found is None:
            return None
        entry, now = found
        return _aged(entry.decisions[0], round((now - entry.at) * 1000, 3))

    def _find(
        self, ids: Ids, limits: tuple[tuple[Any, ...], ...], costs: Sequence[float]
    ) -> Optional[tuple[_Entry, float]]:
        """The live entry that answers this request, and the clock's reading."""
        with self._lock:
            entry = self._entries.get(ids)
            if entry is None:
                self.misses += 1
                return None
            now = self.clock()
            if now >= entry.until:
                self._drop(ids)
                self.misses += 1
                return None
            # Another bucket size or a cheaper request may pass: ask Redis.
            # (One key set, one number of costs: `ids` matched.)
            if entry.limits != limits or not all(map(operator.ge, costs, entry.costs)):
                self.misses += 1
                return None
            self._entries.move_to_end(ids)
            self.hits += 1
        return entry, now

    # ---- a request's way: sent, then answered or failed ---------------------

    def sent(self, op: CacheOp, keys: Sequence[KeyT]) -> Ticket:
        """Call just before the request goes to Redis: the clock is read now."""
        ids = self._ids(keys)
        with self._lock:
            ticket = Ticket(self, op, ids, self.clock())
            for key in ids:
                self._pending.setdefault(key, set()).add(ticket)
        return ticket

    def answered(self, ticket: Ticket, allowed: bool, retry_after_ms: int, decisions: Sequence[Decision]) -> None:
        """Call with Redis's answer: forgets the keys it wrote, and remembers
        it if it is a denial that no write overtook."""
        with self._lock:
            self._release(ticket)
            for key in _written(ticket, allowed, decisions):
                self._forget(key)
            if allowed or ticket.stale or retry_after_ms <= 0 or ticket.op in ("adjust", "reset", "acquire"):
                return
            self._remember(ticket, retry_after_ms, decisions)

    def failed(self, ticket: Ticket) -> None:
        """Call when the request got no answer: whatever could have written
        may have, so its keys are forgotten."""
        with self._lock:
            self._release(ticket)
            if ticket.op != "peek":
                for key in ticket.ids:
                    self._forget(key)

    def forget(self, key: KeyT) -> None:
        """Drops every entry that involves `key`."""
        with self._lock:
            self._forget(self._ids((key,))[0])

    # ---- under the lock -----------------------------------------------------

    def _remember(self, ticket: Ticket, retry_after_ms: int, decisions: Sequence[Decision]) -> None:
        ids = ticket.ids
        entry = _Entry(
            ticket.sent_at,
            ticket.sent_at + retry_after_ms / 1000,
            _limits([d.bucket for d in decisions]),
            tuple(d.cost for d in decisions),
            tuple(decisions),
        )
        self._drop(ids)
        self._entries[ids] = entry
        for key in ids:
            self._by_key.setdefault(key, set()).add(ids)
        while len(self._entries) > self.max_entries:
            self._drop(next(iter(self._entries)))

    def _release(self, ticket: Ticket) -> None:
        for key in ticket.ids:
            waiting = self._pending.get(key)
            if waiting is not None:
                waiting.discard(ticket)
                if not waiting:
                    del self._pending[key]

    def _forget(self, key: bytes) -> None:
        for ids in list(self._by_key.get(key, ())):
            self._drop(ids)
        for ticket in self._pending.get(key, ()):
            ticket.stale = True

    def _drop(self, ids: Ids) -> None:
        if self._entries.pop(ids, None) is None:
            return
        for key in ids:
            owners = self._by_key.get(key)
            if owners is not None:
                owners.discard(ids)
                if not owners:
                    del self._by_key[key]


def denial_cache(option: Union[bool, int, DenialCache, None], encoding: str) -> Optional[DenialCache]:
    """A limiter's `denial_cache` option: None, False or 0 for none, True for
    one of the default size, a number of entries, or a DenialCache (which
    may be shared by limiters whose clients encode keys alike)."""
    if option is None or option is False:
        return None
    if isinstance(option, DenialCache):
        if not option.encoding:
            option.encoding = encoding
        elif option.encoding != encoding:
            raise ValueError(
                f"this DenialCache compares keys encoded as {option.encoding}, the client encodes them as {encoding}"
            )
        return option
    if option is True:
        return DenialCache(encoding=encoding)
    if not isinstance(option, int):
        raise TypeError(f"denial_cache must be a bool, a number of entries or a DenialCache, got {option!r}")
    if option == 0:
        return None
    return DenialCache(option, encoding=encoding)


def _written(ticket: Ticket, allowed: bool, decisions: Sequence[Decision]) -> Sequence[bytes]:
    """The keys an answered request wrote."""
    op = ticket.op
    if op in ("adjust", "reset"):
        return ticket.ids
    if op == "peek":
        return ()
    if allowed:  # consume, mconsume, each, acquire: every bucket paid its cost
        return [key for key, d in zip(ticket.ids, decisions, strict=True) if d.cost > 0]
    if op == "each":
        # Denied bucket by bucket: those before the denying one were
        # charged, then refunded.
        written = []
        for key, d in zip(ticket.ids, decisions, strict=True):
            if not d.allowed:
                break
            if d.cost > 0:
                written.append(key)
        return written
    return ()


def _limits(buckets: Sequence[Rule]) -> tuple[tuple[Any, ...], ...]:
    # The policy name doesn't change what passes; a quota never matches a
    # bucket of the same numbers.
    return tuple(b._ident for b in buckets)


def _aged(d: Decision, elapsed_ms: float) -> Decision:
    retry = max(0, math.ceil(d.retry_after_ms - elapsed_ms)) if d.retry_after_ms else 0
    reset = max(retry, math.ceil(d.reset_after_ms - elapsed_ms))
    # dataclasses.replace, in one step: this runs on every cache hit, the
    # one call a client in a retry loop makes.
    aged = object.__new__(Decision)
    object.__setattr__(
        aged,
        "__dict__",
        {
            **d.__dict__,
            "allowed": d.allowed or retry == 0,
            "retry_after_ms": retry,
            "reset_after_ms": reset,
            "cached": True,
        },
    )
    return aged
