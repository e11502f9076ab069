"""Holding a lease while a block runs: `hold` and `keep` of both limiters.

On entry the lease is acquired (`hold`) or taken as given (`keep`); a lease
that is not acquired raises `Busy`. While the block runs, the lease is
renewed in the background about every `lease_ms / 3` (a daemon thread for
the sync limiter, a task for the asyncio one), so the caller never waits
for a renewal; a renewal that finds the lease gone sets `lease.lost` and
stops. On every exit (a return, an exception, an asyncio cancellation) the
lease is released; a release that fails (Redis unreachable) is logged, and
the lease is left to expire.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, Optional

from ._lease import Busy, Lease

log = logging.getLogger("redis_tokenbucket")

# Tasks that must finish though their caller was cancelled (a release, an
# acquire whose answer came late): kept here so they are not collected.
_BACKGROUND: set[asyncio.Future[Any]] = set()


def renew_every(lease: Lease) -> float:
    """Seconds between renewals: a third of the lease, so two renewals can
    fail before it expires."""
    return lease.concurrency.lease_ms / 3000


def _lost(lease: Lease) -> None:
    log.warning(
        "lease %r on %r is lost: a renewal found it expired or released; its slot is no longer held",
        lease.id,
        lease.key,
    )


def _renew_failed(lease: Lease, exc: BaseException) -> None:
    log.warning(
        "lease %r on %r: a renewal failed (%s: %s); trying again in %.3g s",
        lease.id,
        lease.key,
        type(exc).__name__,
        exc,
        renew_every(lease),
    )


def _release_failed(lease: Lease, exc: BaseException) -> None:
    log.warning(
        "lease %r on %r could not be released (%s: %s); it is left to expire, within %d ms",
        lease.id,
        lease.key,
        type(exc).__name__,
        exc,
        lease.concurrency.lease_ms,
    )


class Hold:
    """``with lim.hold(key, concurrency) as lease:`` (or ``lim.keep(lease)``)
    on the sync Limiter."""

    def __init__(self, limiter: Any, acquire: Optional[Callable[[], Lease]], lease: Optional[Lease] = None) -> None:
        self._limiter = limiter
        self._acquire = acquire
        self.lease = lease
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def __enter__(self) -> Lease:
        lease = self._acquire() if self._acquire is not None else self.lease
        assert lease is not None
        self.lease = lease
        if not lease.acquired:
            raise Busy(lease)
        self._thread = threading.Thread(target=self._renew, name=f"redis_tokenbucket renew {lease.id!r}", daemon=True)
        self._thread.start()
        return lease

    def _renew(self) -> None:
        lease = self.lease
        assert lease is not None
        while not self._stop.wait(renew_every(lease)):
            try:
                renewed = self._limiter.renew(lease)
            except Exception as exc:
                _renew_failed(lease, exc)
                continue
            if not renewed:
                if not self._stop.is_set():
                    _lost(lease)
                return

    def __exit__(
        self, kind: Optional[type[BaseException]], exc: Optional[BaseException], tb: Optional[TracebackType]
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            # At most one renewal in flight, bounded by the limiter's timeout;
            # after it, no renewal can land after the release.
            self._thread.join()
        lease = self.lease
        assert lease is not None
        try:
            self._limiter.release(lease)
        except Exception as exc:
            _release_failed(lease, exc)


class AsyncHold:
    """``async with lim.hold(key, concurrency) as lease:`` (or
    ``lim.keep(lease)``) on the asyncio Limiter."""

    def __init__(
        self, limiter: Any, acquire: Optional[Callable[[], Awaitable[Lease]]], lease: Optional[Lease] = None
    ) -> None:
        self._limiter = limiter
        self._acquire = acquire
        self.lease = lease
        self._renewer: Optional[asyncio.Task[None]] = None

    async def __aenter__(self) -> Lease:
        if self._acquire is not None:
            asking = asyncio.ensure_future(self._acquire())
            try:
                lease = await asyncio.shield(asking)
            except asyncio.CancelledError:
                # The acquire goes on; if it takes the slot, it is given back.
                asking.add_done_callback(self._give_back)
                raise
            self.lease = lease
        held = self.lease
        assert held is not None
        if not held.acquired:
            raise Busy(held)
        self._renewer = asyncio.ensure_future(self._renew(held))
        return held

    def _give_back(self, asking: asyncio.Future[Lease]) -> None:
        if asking.cancelled() or asking.exception() is not None:
            return
        lease = asking.result()
        if lease.acquired:
            background(self._release(lease))

    async def _renew(self, lease: Lease) -> None:
        while True:
            await asyncio.sleep(renew_every(lease))
            try:
                renewed = await self._limiter.renew(lease)
            except Exception as exc:
                _renew_failed(lease, exc)
                continue
            if not renewed:
                _lost(lease)
                return

    async def _release(self, lease: Lease) -> None:
        try:
            await self._limiter.release(lease)
        except Exception as exc:
            _release_failed(lease, exc)

    async def __aexit__(
        self, kind: Optional[type[BaseException]], exc: Optional[BaseException], tb: Optional[TracebackType]
    ) -> None:
        if self._renewer is not None:
            self._renewer.cancel()
        lease = self.lease
        assert lease is not None
        # Shielded: a cancelled block (an asyncio cancellation, a client
        # that went away) still gives its slot back; the release goes on
        # while the cancellation goes up.
        await asyncio.shield(background(self._release(lease)))


def background(coro: Awaitable[Any]) -> asyncio.Future[Any]:
    """A task that runs to its end whatever happens to whoever awaits it."""
    task = asyncio.ensure_future(coro)
    _BACKGROUND.add(task)
    task.add_done_callback(_BACKGROUND.discard)
    return task
