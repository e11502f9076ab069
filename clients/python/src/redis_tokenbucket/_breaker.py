"""The circuit breaker: once Redis has failed often enough lately, calls get
their failure policy at once, without a try and without a timeout's cost,
until a probe finds Redis back (docs/failure-model.md)."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Literal

State = Literal["closed", "open", "half_open"]

# What `enter` tells a call to do.
CALL = 0  # ask Redis
PROBE = 1  # ask Redis, as the one probe of a half-open breaker
SKIP = 2  # don't: the breaker is open, answer by the policy


class Breaker:
    """Opens after `failures` Redis failures within `window` seconds; after
    `cooldown` seconds open, one call probes Redis (half-open) while the
    others still get the policy; the probe's success closes it, its failure
    opens it for another `cooldown`. Only Redis failures count: usage errors
    and shed calls (local overload) never do.

    Defaults (5 failures in 10 s, 2 s cooldown) fit a request path: a dead
    or frozen Redis costs a handful of calls their timeout, then nothing.
    One breaker per limiter; thread-safe. `clock` must be monotonic."""

    def __init__(
        self,
        failures: int = 5,
        window: float = 10.0,
        cooldown: float = 2.0,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not (isinstance(failures, int) and not isinstance(failures, bool) and failures >= 1):
            raise ValueError("failures must be an int >= 1")
        if not window > 0:
            raise ValueError("window must be > 0 seconds")
        if not cooldown > 0:
            raise ValueError("cooldown must be > 0 seconds")
        self.failures = failures
        self.window = float(window)
        self.cooldown = float(cooldown)
        self.clock = clock
        self.state: State = "closed"
        self._recent: deque[float] = deque()
        self._opened_at = 0.0
        self._probe_at: float | None = None  # when the running probe started
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        limits = f"failures={self.failures}, window={self.window}, cooldown={self.cooldown}"
        return f"Breaker({limits}, state={self.state!r})"

    def enter(self) -> int:
        """CALL, PROBE or SKIP for the call about to be made."""
        if self.state == "closed":  # the hot path, without the lock
            return CALL
        with self._lock:
            state: State = self.state  # again, under the lock
            if state == "closed":
                return CALL
            now = self.clock()
            if state == "open":
                if now - self._opened_at < self.cooldown:
                    return SKIP
                self.state = "half_open"
            # Half-open: one probe at a time; a probe that never reported
            # (its caller went away) is replaced after a cooldown.
            if self._probe_at is not None and now - self._probe_at < self.cooldown:
                return SKIP
            self._probe_at = now
            return PROBE

    def success(self, probe: bool) -> None:
        """Redis answered (a decision, or a usage error: it is there)."""
        if not probe and self.state == "closed":
            return
        with self._lock:
            if probe or self.state != "closed":
                self.state = "closed"
                self._recent.clear()
                self._probe_at = None

    def failure(self, probe: bool) -> None:
        """Redis failed this call."""
        with self._lock:
            now = self.clock()
            if probe or self.state != "closed":
                self._open(now)
                return
            recent = self._recent
            recent.append(now)
            while recent and now - recent[0] > self.window:
                recent.popleft()
            if len(recent) >= self.failures:
                self._open(now)

    def release(self, probe: bool) -> None:
        """The call ended without news of Redis (shed): let another probe."""
        if probe:
            with self._lock:
                self._probe_at = None

    def _open(self, now: float) -> None:
        self.state = "open"
        self._opened_at = now
        self._probe_at = None
        self._recent.clear()
