"""A steady load on saturated buckets, for the failover tests and `make
bench-failover`: one thread sends a `consume` every `interval` seconds,
round-robin over the keys, through any limiter, and tallies the answers.

The exact budget of a bucket over a run is what a perfect limiter could
have admitted: `max` at once, then `rate` a second, from the first call
sent to the last answer received (the server's clock is the same machine's
clock). Minted is counted by replaying what Redis admitted, in order,
through an exact bucket (tokens capped at `max`, so the refill of an
outage during which nothing was admitted is not counted as budget): the
deepest it went below zero is what was admitted beyond the budget.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Optional, Protocol

from redis_tokenbucket import Bucket


class Verdict(Protocol):
    """What the load reads of an answer: a Decision, or a bench's own."""

    @property
    def allowed(self) -> bool: ...
    @property
    def degraded(self) -> bool: ...


@dataclass
class Answer:
    key: str
    at: float  # time.time() when the answer came
    allowed: bool
    degraded: bool


@dataclass
class Tally:
    """What one load got: counts and each answer in order."""

    answers: list[Answer] = field(default_factory=list)
    first_sent: Optional[float] = None
    last_answer: Optional[float] = None

    @property
    def admitted(self) -> int:
        """Admitted by Redis (a degraded answer is the policy's, not Redis's)."""
        return sum(a.allowed and not a.degraded for a in self.answers)

    @property
    def degraded(self) -> int:
        return sum(a.degraded for a in self.answers)

    @property
    def denied(self) -> int:
        return sum(not a.allowed and not a.degraded for a in self.answers)


def budget(bucket: Bucket, keys: int, first: float, last: float) -> int:
    """The most a perfect limiter admits on `keys` buckets, full at `first`,
    until `last`."""
    return keys * math.floor(bucket.max + bucket.rate * (last - first) + 1e-9)


def minted(bucket: Bucket, tallies: list[Tally]) -> int:
    """Tokens admitted beyond an exact bucket's budget, over every load on
    the same keys: each Redis admission, at the time its answer came (the
    server decided earlier, so the replay refills at least as much as the
    server did and never counts a token that was not minted), is taken
    from an exact bucket full at the first call; per key, the deepest debt
    it reaches, summed."""
    first = min(t.first_sent for t in tallies if t.first_sent is not None)
    admitted = sorted((a.at, a.key) for t in tallies for a in t.answers if a.allowed and not a.degraded)
    tokens: dict[str, float] = {}
    at: dict[str, float] = {}
    debt: dict[str, float] = {}
    for when, key in admitted:
        t = min(bucket.max, tokens.get(key, bucket.max) + bucket.rate * (when - at.get(key, first))) - 1
        tokens[key], at[key] = t, when
        debt[key] = max(debt.get(key, 0.0), -t)
    return sum(math.floor(d + 1e-9) for d in debt.values())


class Load:
    """`consume(key)` every `interval` s on one thread until `stop()`;
    `pause()` returns once no call is in flight."""

    def __init__(self, consume: Callable[[str], Verdict], keys: list[str], interval: float) -> None:
        self.consume = consume
        self.keys = keys
        self.interval = interval
        self.tally = Tally()
        self.error: Optional[BaseException] = None
        self._running = threading.Event()
        self._idle = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> Load:
        self._running.set()
        self._thread.start()
        _started.append(self)
        return self

    def pause(self) -> None:
        self._idle.clear()
        self._running.clear()
        self._idle.wait(10)

    def resume(self) -> None:
        self._running.set()

    def stop(self) -> Tally:
        self._stop.set()
        self._running.set()
        self._thread.join(30)
        if self.error is not None:
            raise self.error
        return self.tally

    def _run(self) -> None:
        i = 0
        next_at = time.monotonic()
        try:
            while not self._stop.is_set():
                if not self._running.is_set():
                    self._idle.set()
                    self._running.wait()
                    next_at = time.monotonic()
                    continue
                key = self.keys[i % len(self.keys)]
                sent = time.time()
                d = self.consume(key)
                now = time.time()
                if self.tally.first_sent is None:
                    self.tally.first_sent = sent
                self.tally.last_answer = now
                self.tally.answers.append(Answer(key, now, d.allowed, d.degraded))
                i += 1
                next_at += self.interval
                delay = next_at - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                else:
                    next_at = time.monotonic()  # behind (a call waited on a timeout): no catch-up burst
        except BaseException as e:  # surfaced by stop()
            self.error = e
        finally:
            self._idle.set()


_started: list[Load] = []


def stop_all() -> None:
    """Stops every load still running (a test that failed midway), so none
    goes on against servers that are gone."""
    while _started:
        load = _started.pop()
        load._stop.set()
        load._running.set()
        load._thread.join(30)


def limiter_load(lim: Any, bucket: Bucket, keys: list[str], interval: float) -> Load:
    return Load(lambda key: lim.consume(key, bucket), keys, interval)
