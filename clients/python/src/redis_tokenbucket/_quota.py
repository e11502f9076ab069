"""Calendar quotas: a budget that resets at the start of each period (a
UTC day, ISO week, month or year, or N seconds from the epoch), checked
with the module's rules and messages (core/src/quota/args.rs), and
charged with TB.QUOTA, TB.QPEEK and TB.QADJUST where a Bucket would be
charged with TB.CONSUME, TB.PEEK and TB.ADJUST."""

from __future__ import annotations

import calendar
import datetime
from dataclasses import dataclass, field
from typing import Any, ClassVar, Optional, Union

from ._bucket import Bucket, capped_cost, check_name, encode, invalid, number
from ._contract import MAX_CAPACITY, MAX_OFFSET_MINUTES, MAX_PERIOD_SECONDS

# The calendar periods, as sent, and their length where it is fixed.
NAMED = {"day": 86400, "week": 7 * 86400, "month": 0, "year": 0}


@dataclass(frozen=True)
class Quota:
    """`limit` units per `period`, reset at each period's start.

    `period` is "day", "week" (ISO, from Monday), "month" or "year" on
    the UTC calendar, or a whole number of seconds (1 to 1e10) counted from
    the Unix epoch: not from first use. `offset` moves the boundaries to a
    local midnight: minutes ahead of UTC, -1439 to 1439 (a fixed offset,
    so no daylight saving). `name` names the policy in the RateLimit
    fields; by default the period ("month", "3600s"). Checked when built,
    with the module's messages: `0 < limit <= 1e12`.

    A quota never refills within its period: what is spent stays spent
    until the reset, and a refund (`adjust`) is given back to this period
    only.
    """

    limit: float
    period: Union[str, int]
    offset: int = 0
    name: Optional[str] = None
    # The arguments as sent, encoded once: `limit period`, then `OFFSET m`
    # (after the amount) when there is an offset.
    _limit_args: tuple[str, str] = field(init=False, repr=False, compare=False)
    _after_args: tuple[str, ...] = field(init=False, repr=False, compare=False)
    # What the denial cache tells rules apart by (the name passes nothing).
    _ident: tuple[Any, ...] = field(init=False, repr=False, compare=False)
    kind: ClassVar[str] = "quota"

    def __post_init__(self) -> None:
        limit = number(self.limit, "limit")
        if not 0 < limit <= MAX_CAPACITY:
            raise invalid("limit", "limit_out_of_range")
        period = check_period(self.period)
        offset = check_offset(self.offset)
        if self.name is not None:
            check_name(self.name)
        sent = period.upper() if isinstance(period, str) else str(period)
        object.__setattr__(self, "limit", limit)
        object.__setattr__(self, "period", period)
        object.__setattr__(self, "offset", offset)
        object.__setattr__(self, "_limit_args", (encode(limit), sent))
        object.__setattr__(self, "_after_args", ("OFFSET", str(offset)) if offset else ())
        object.__setattr__(self, "_ident", ("quota", limit, sent, offset))

    @property
    def max(self) -> float:
        """The limit: what a full period holds, as a Bucket's `max`."""
        return self.limit

    @property
    def label(self) -> str:
        """The period's name in the RateLimit fields: "day" ... or "<n>s"."""
        return self.period if isinstance(self.period, str) else f"{self.period}s"

    def period_seconds(self, ends_at: float) -> int:
        """The length of the period that ends at `ends_at` (Unix seconds):
        fixed but for months and years, whose length is that of the
        calendar month or year (at UTC plus the offset) the day before."""
        if isinstance(self.period, int):
            return self.period
        fixed = NAMED[self.period]
        if fixed:
            return fixed
        # A day before the end lies in the period whatever the skew
        # between this clock and the server's, short of a day.
        day = datetime.datetime.fromtimestamp(ends_at + self.offset * 60 - 86400, datetime.timezone.utc)
        if self.period == "month":
            return calendar.monthrange(day.year, day.month)[1] * 86400
        return (366 if calendar.isleap(day.year) else 365) * 86400

    def named(self, name: str) -> Quota:
        """The same quota under another policy name."""
        return Quota(self.limit, self.period, self.offset, name)


def check_period(period: Any) -> Union[str, int]:
    if isinstance(period, str) and period.lower() in NAMED:
        return period.lower()
    if isinstance(period, int) and not isinstance(period, bool) and 1 <= period <= MAX_PERIOD_SECONDS:
        return period
    raise invalid("period", "bad_period")


def check_offset(offset: Any) -> int:
    if not isinstance(offset, int) or isinstance(offset, bool):
        raise invalid("offset", "not_an_integer", arg="offset")
    m = MAX_OFFSET_MINUTES
    if not -m <= offset <= m:
        raise invalid("offset", "int_out_of_range", arg="offset", least=-m, most=m)
    return offset


def check_quota_cost(cost: Any, quota: Quota, group: Optional[int] = None) -> float:
    """A cost for `quota`, in the module's order of checks."""
    return capped_cost(cost, quota.limit, ("cost_above_limit", "quota_cost_too_small"), group)


Rule = Union[Bucket, Quota]
"""What a key is charged by: a token bucket or a calendar quota."""
