"""Buckets and argument checks, with the module's rules and error texts
(core/src/args.rs, core/src/number/parse.rs), so a bad limit fails where it is
written instead of as an error reply on a request path."""

from __future__ import annotations

import math
import numbers
import re
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, ClassVar, Optional

from ._contract import (
    LIMIT_ALIASES,
    LIMIT_ERROR,
    LIMIT_MULTIPLE_LEAST,
    LIMIT_MULTIPLE_MOST,
    LIMIT_PER,
    LIMIT_SEPARATORS,
    LIMIT_UNITS,
    MAX_CAPACITY,
    MAX_FILL_SECONDS,
    MAX_RATE,
    message,
)
from ._keys import KeyT as KeyT  # where the other modules have always imported it from

# [+-] (digits [. digits] | . digits) [(e|E) [+-] digits], ASCII digits only:
# the grammar the module and the Lua library accept.
_DECIMAL = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")

# From this on an int is no finite double (and float() would raise).
_HUGE = 2**1024
_ULP_BOUND = 2.0**-50

# Limit strings (contract.json's "limit_strings"). ASCII whitespace only,
# as Lua's %s and the Node parser read it: the three must agree on a string.
_SPACE = " \t\n\r\f\v"
_SPACES = frozenset(_SPACE)  # a set: "" is in every string, never in this
# N: whatever stands before the per word or "/"; number() then checks it.
_COUNT = re.compile(r"([^/ \t\n\r\f\v]+)[ \t\n\r\f\v]*(.*)", re.S)
# [k] unit, after the per word.
_UNIT = re.compile(r"([0-9]*)[ \t\n\r\f\v]*([a-z]+)")


class InvalidArgument(ValueError):
    """A limit, cost or delta the module would refuse. The message is the
    module's error text without its `ERR ` prefix, and starts with the
    field's name; `field` holds that name."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def invalid(field: str, error: str, group: Optional[int] = None, **values: object) -> InvalidArgument:
    """The module's reply `error` (contract/contract.json) as an
    InvalidArgument about `field`: its text without the `ERR ` prefix."""
    return InvalidArgument(field, message(error, group=group, **values).removeprefix("ERR "))


def number(value: Any, name: str, group: Optional[int] = None) -> float:
    """A finite decimal as a float; `InvalidArgument` for anything the
    module's grammar refuses (NaN, infinities, bools, hex or padded text)."""
    kind = type(value)
    if kind is float or kind is int:  # the usual case, first
        result = float(value) if value == value and abs(value) < _HUGE else math.inf
        if math.isfinite(result):
            return result
    elif isinstance(value, str):
        if _DECIMAL.fullmatch(value):
            result = float(value)
            if math.isfinite(result):
                return result
    elif isinstance(value, (numbers.Real, Decimal)) and not isinstance(value, bool):
        try:
            result = float(value)
        except OverflowError:  # an int or Fraction beyond the double range
            result = math.inf
        if math.isfinite(result):
            return result
    raise invalid(name, "not_a_number", group, arg=name)


def encode(value: float) -> str:
    """How a checked number is sent: repr() of a finite float always fits
    the grammar (`10.0`, `0.17`, `1e-05`) and parses back to the same double."""
    return repr(value)


def check_cost(cost: Any, bucket: Bucket, group: Optional[int] = None) -> float:
    return capped_cost(cost, bucket.max, ("cost_above_max", "cost_too_small"), group)


def capped_cost(cost: Any, capacity: float, errors: tuple[str, str], group: Optional[int] = None) -> float:
    """A cost of at most `capacity` (a bucket's max, a quota's limit), in the
    module's order of checks; `errors` name the contract's messages for
    above the capacity and for too small to charge it."""
    value = number(cost, "cost", group)
    if value < 0:
        raise invalid("cost", "cost_negative", group)
    if value > capacity:
        raise invalid("cost", errors[0], group)
    if charges_nothing(value, capacity):
        raise invalid("cost", errors[1], group)
    return value


def charges_nothing(cost: float, max_: float) -> bool:
    """A positive cost so small that taking it from a balance near `max`
    rounds back to that balance: admitted forever, charging nothing. The
    top two doubles up to `max` keep the most in rounding, so checking
    those two is exact (the module's rule, core/src/args.rs)."""
    if cost > max_ * _ULP_BOUND:
        # Above the spacing of doubles near `max` (at most max * 2**-52):
        # both subtractions move. The usual case, without nextafter.
        return False
    below = math.nextafter(max_, -math.inf)
    return cost > 0 and (max_ - cost == max_ or below - cost == below)


def check_delta(delta: Any) -> float:
    return number(delta, "delta")


def check_name(name: str) -> str:
    # Policy names are sf-strings in the RateLimit fields: printable ASCII.
    if not isinstance(name, str) or not name or any(not " " <= c <= "~" for c in name):
        raise InvalidArgument("name", "name must be a non-empty string of printable ASCII")
    return name


@dataclass(frozen=True)
class Bucket:
    """`max` tokens of burst, refilled at `rate` tokens per second.

    Checked when built, with the module's rules and messages
    (contract/contract.json): `0 < max <= 1e12`, `0 < rate <= 1e12`,
    `max / rate <= 1e10` seconds. `name` names the
    policy in the RateLimit headers (`"user";q=10;w=59`).
    """

    max: float
    rate: float
    name: Optional[str] = None
    # The arguments as sent, encoded once (a Quota also has some after the
    # amount: its OFFSET).
    _limit_args: tuple[str, str] = field(init=False, repr=False, compare=False)
    _after_args: ClassVar[tuple[str, ...]] = ()
    # What the denial cache tells rules apart by (the name passes nothing).
    _ident: tuple[Any, ...] = field(init=False, repr=False, compare=False)
    kind: ClassVar[str] = "bucket"

    def __post_init__(self) -> None:
        max_ = number(self.max, "max")
        if not 0 < max_ <= MAX_CAPACITY:
            raise invalid("max", "max_out_of_range")
        rate = number(self.rate, "rate")
        if not 0 < rate <= MAX_RATE:
            raise invalid("rate", "rate_out_of_range")
        if max_ / rate > MAX_FILL_SECONDS:
            raise invalid("rate", "fill_too_slow")
        if self.name is not None:
            check_name(self.name)
        object.__setattr__(self, "max", max_)
        object.__setattr__(self, "rate", rate)
        object.__setattr__(self, "_limit_args", (encode(max_), encode(rate)))
        object.__setattr__(self, "_ident", (max_, rate))

    @property
    def fill_seconds(self) -> float:
        """Seconds an empty bucket takes to fill."""
        return self.max / self.rate

    def named(self, name: str) -> Bucket:
        """The same limits under another policy name."""
        return Bucket(self.max, self.rate, name)

    @classmethod
    def parse(cls, limit: str, name: Optional[str] = None) -> Bucket:
        """A limit string as the `limits` library (and slowapi) writes it,
        `"N/unit"`, `"N/k units"`, `"N per unit"` or `"N per k units"`, as
        a bucket of `max=N` refilled at `N` per `k` units::

            Bucket.parse("10/minute")  # Bucket(max=10, rate=10/60): a burst of 10, then one every 6 s
            Bucket.parse("100 per 5 minutes")  # Bucket(max=100, rate=100/300)

        Units: second, minute, hour, day, month (30 days), year (360 days),
        singular or plural, or s, sec, m, min, h, hr, d, mo, y; case is
        ignored. `InvalidArgument` (field `limit`) names a string outside
        that grammar; N is then checked as the bucket's `max`.

        A token bucket, not a window: the whole N may be spent at once, and
        tokens come back one by one through the period, never all at a
        window's edge. So a client that spent them waits period/N for the
        next one, and the most it gets in any period is about 2N (the burst,
        then the period's refill). `"1000/day"` is such a bucket too, not a
        budget that resets at midnight: that is a `Quota`.
        """
        count, seconds = _read_limit(limit)
        n = number(count, "max")
        return cls(n, n / seconds, name)

    @classmethod
    def parse_many(cls, limits: str) -> list[Bucket]:
        """Several limit strings joined by `;`, `,` or `|`
        (`"10/second;1000/day"`), as `limits.parse_many` reads them: one
        bucket each, in order. Each needs a key of its own (a bucket's key
        holds one bucket), as `consume_many` groups, say."""
        if not isinstance(limits, str):
            raise _limit_error(limits)
        parts = [limits]
        for separator in LIMIT_SEPARATORS:
            parts = [piece for part in parts for piece in part.split(separator)]
        return [cls.parse(part) for part in parts]


def _limit_error(limit: object) -> InvalidArgument:
    text = limit.strip(_SPACE) if isinstance(limit, str) else str(limit)
    return InvalidArgument("limit", LIMIT_ERROR.format(limit=text))


def _read_limit(limit: object) -> tuple[str, int]:
    """A limit string's N (as written) and its k units in seconds, or the
    grammar's error naming it; in the same steps as the Node and
    OpenResty parsers, so all three read a string alike."""
    if not isinstance(limit, str) or not limit.isascii():
        raise _limit_error(limit)
    head = _COUNT.fullmatch(limit.strip(_SPACE))
    if head is None:
        raise _limit_error(limit)
    rest = head[2].lower()
    for per in LIMIT_PER:
        # A word needs a space after it ("10 per minute", not "10 perminute");
        # one before it is there already, N ending at the first space.
        if rest.startswith(per) and (per == "/" or rest[len(per) : len(per) + 1] in _SPACES):
            tail = _UNIT.fullmatch(rest[len(per) :].lstrip(_SPACE))
            break
    else:
        raise _limit_error(limit)
    unit = LIMIT_ALIASES.get(tail[2]) if tail else None
    if tail is None or unit is None:
        raise _limit_error(limit)
    digits = tail[1].lstrip("0") or tail[1]
    # Too many digits is out of range already; int() would refuse thousands.
    if len(digits) > len(str(LIMIT_MULTIPLE_MOST)):
        raise _limit_error(limit)
    multiple = int(digits) if digits else 1
    if not LIMIT_MULTIPLE_LEAST <= multiple <= LIMIT_MULTIPLE_MOST:
        raise _limit_error(limit)
    return head[1], multiple * LIMIT_UNITS[unit]
