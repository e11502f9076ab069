"""Bucket and argument checks: the module's rules and texts, before any
round trip."""

from __future__ import annotations

import math
from decimal import Decimal
from fractions import Fraction

import pytest
import redis
from conftest import Target

from redis_tokenbucket import Bucket, InvalidArgument, Limiter

# (max, rate, cost, field, message): the module's own cases, docs/commands.md.
BAD = [
    ("x", 1, 1, "max", "max must be a finite decimal number"),
    ("nan", 1, 1, "max", "max must be a finite decimal number"),
    (float("inf"), 1, 1, "max", "max must be a finite decimal number"),
    ("0x10", 1, 1, "max", "max must be a finite decimal number"),
    (" 10", 1, 1, "max", "max must be a finite decimal number"),
    ("", 1, 1, "max", "max must be a finite decimal number"),
    ("1e309", 1, 1, "max", "max must be a finite decimal number"),
    ("\u0661\u0660", 1, 1, "max", "max must be a finite decimal number"),  # Arabic-Indic digits
    (True, 1, 1, "max", "max must be a finite decimal number"),
    (0, 1, 1, "max", "max must be > 0 and <= 1e12"),
    (-1, 1, 1, "max", "max must be > 0 and <= 1e12"),
    ("1e-400", 1, 1, "max", "max must be > 0 and <= 1e12"),  # underflows to 0
    (2e12, 1, 1, "max", "max must be > 0 and <= 1e12"),
    (10, "inf", 1, "rate", "rate must be a finite decimal number"),
    (10, 0, 1, "rate", "rate must be > 0 and <= 1e12"),
    (10, -0.5, 1, "rate", "rate must be > 0 and <= 1e12"),
    (10, 1e13, 1, "rate", "rate must be > 0 and <= 1e12"),
    (1e12, 1, 1, "rate", "rate is too low for max: max/rate must be <= 1e10 seconds"),
    (1e11, 1, 1, "rate", "rate is too low for max: max/rate must be <= 1e10 seconds"),
    (10, 1, "0x1", "cost", "cost must be a finite decimal number"),
    (10, 1, float("nan"), "cost", "cost must be a finite decimal number"),
    (10, 1, -1, "cost", "cost must be >= 0"),
    (10, 1, 11, "cost", "cost must not exceed max, it could never pass"),
    # The default cost of 1 can't pass a bucket smaller than 1.
    (0.5, 1, 1, "cost", "cost must not exceed max, it could never pass"),
    # 1e12 - 1e-5 == 1e12: admitted forever, charging nothing.
    (1e12, 1000, 0.00001, "cost", "cost is too small to charge a bucket of this max: use 0 or at least max/2^53"),
    (1, 1, 1e-17, "cost", "cost is too small to charge a bucket of this max: use 0 or at least max/2^53"),
]


@pytest.mark.parametrize("max_, rate, cost, field, message", BAD)
def test_bad_arguments_raise_the_modules_error(max_, rate, cost, field, message, module_target: Target):
    lim = Limiter(module_target.client())
    with pytest.raises(InvalidArgument) as raised:
        lim.consume("rl:bad", Bucket(max_, rate), cost)
    assert (raised.value.field, str(raised.value)) == (field, message)
    assert isinstance(raised.value, ValueError)
    # The module says the same about the same arguments.
    with module_target.client() as r, pytest.raises(redis.ResponseError) as replied:
        r.execute_command("TB.CONSUME", "rl:bad", str(max_).strip() if max_ != " 10" else max_, rate, cost)
    assert str(replied.value) == message
    assert calls(module_target) == 1  # only the raw call above reached Redis


def calls(target: Target) -> int:
    with target.admin() as admin:
        stats = admin.info("commandstats")
    return sum(int(s["calls"]) for name, s in stats.items() if name.startswith("cmdstat_tb."))


@pytest.mark.parametrize(
    "value, expected",
    [
        ("10", 10.0),
        ("+.5", 0.5),
        ("5.", 5.0),
        ("1E3", 1000.0),
        ("-0", 0.0),
        (Decimal("2.5"), 2.5),
        (Fraction(1, 4), 0.25),
    ],
)
def test_the_grammar_accepts_decimals(value, expected, module_target: Target):
    """Each value as a cost (which may be 0, as "-0" is), and as a max
    where it is positive."""
    lim = Limiter(module_target.client())
    d = lim.consume("rl:grammar", Bucket(1e6, 1), value)
    assert d.allowed and d.cost == expected
    if expected > 0:
        assert Bucket(max=value, rate=1).max == expected
    # The module read what was sent as the same number: what it charged.
    assert d.remaining == math.floor(1e6 - expected)


@pytest.mark.parametrize("max_", [1e12, 10.0, 1.0, 0.5, 3.0, 1024.0000000000002, 7.3e-5])
def test_the_smallest_charging_cost_is_the_modules(max_: float, module_target: Target):
    """Around the threshold (half the gap below max) each side answers the
    same: a cost either charges or is refused as too small."""
    lim = Limiter(module_target.client())
    gap = max_ - math.nextafter(max_, 0)
    with module_target.client() as r:
        for cost in (gap / 2 * (1 - 2**-52), gap / 2, gap / 2 * (1 + 2**-52), gap, max_ / 2**53):
            try:
                lim.peek("rl:tiny", Bucket(max_, 1), cost)
                ours = "ok"
            except InvalidArgument as exc:
                ours = str(exc)
            try:
                r.execute_command("TB.PEEK", "rl:tiny", repr(max_), "1", repr(cost))
                theirs = "ok"
            except redis.ResponseError as exc:
                theirs = str(exc)
            assert ours == theirs, (max_, cost)


def test_a_cost_above_the_spacing_near_max_charges():
    """charges_nothing answers a cost above max * 2**-50 without the full
    rule (the usual case, no nextafter): the full rule agrees there, for
    maxes across the exponents and costs at and just above that bound."""
    from redis_tokenbucket._bucket import charges_nothing

    for exponent in range(-40, 41):
        for mantissa in (1.0, 1.0000000000000002, 1.5, 1.9999999999999998):
            max_ = math.ldexp(mantissa, exponent)
            below = math.nextafter(max_, -math.inf)
            bound = max_ * 2.0**-50
            for cost in (bound, math.nextafter(bound, math.inf), bound * 1.5, bound * 4, max_):
                full = cost > 0 and (max_ - cost == max_ or below - cost == below)
                assert charges_nothing(cost, max_) == full, (max_, cost)
                if cost > bound:
                    assert not full


def test_bucket_is_a_value():
    assert Bucket(max=1e6, rate=1, name="x").named("y").name == "y"
    assert Bucket(10, 0.17) == Bucket(10.0, "0.17")
    assert Bucket(10, 1, name="user") != Bucket(10, 1, name="ip")
    assert hash(Bucket(10, 1)) == hash(Bucket(10.0, 1.0))
    assert Bucket(10, 0.5).fill_seconds == 20


def test_consume_many_reports_the_modules_first_error(module_target: Target):
    """The group count first, then each group, then duplicate keys."""
    b = Bucket(10, 1)
    cases = [
        [("a", b), ("a", b), ("c", b, 11)],  # a bad cost beats an earlier duplicate
        [("a", b, 11)] + [(f"k{i}", b) for i in range(10_000)],  # too many beats a bad group
        [("a", b), ("b", b, -1), ("c", b, 11)],
    ]
    lim = Limiter(module_target.client())
    with module_target.client() as r:
        for groups in cases:
            with pytest.raises(InvalidArgument) as ours:
                lim.consume_many(groups)
            args = [a for k, bucket, *cost in groups for a in (k, bucket.max, bucket.rate, cost[0] if cost else 1)]
            with pytest.raises(redis.ResponseError) as theirs:
                r.execute_command("TB.MCONSUME", *args)
            assert str(ours.value) == str(theirs.value)


def test_bad_names_and_groups():
    with pytest.raises(InvalidArgument, match="name must be"):
        Bucket(1, 1, name="caf\u00e9")
    with pytest.raises(InvalidArgument, match="name must be"):
        Bucket(1, 1, name="")
    lim = Limiter(redis.Redis(port=1))  # never reached: every call below fails its checks
    b = Bucket(10, 1)
    cases = [
        ([], "consume_many needs at least one"),
        ([("a", b, 1), ("b", b, 11)], "cost must not exceed max, it could never pass (group 2)"),
        ([("a", b, 1), ("b", b, "nan")], "cost must be a finite decimal number (group 2)"),
        ([("b", b), ("a", b), ("c", b), ("a", b)], "duplicate key: group 4 repeats the key of group 2"),
        ([("a", b), (b"a", b)], "duplicate key: group 2 repeats the key of group 1"),
        ([(f"k{i}", b) for i in range(10_001)], "too many buckets: at most 10000 groups per call"),
    ]
    for groups, message in cases:
        with pytest.raises(InvalidArgument) as raised:
            lim.consume_many(groups, on_error="open")
        assert str(raised.value).startswith(message)
    with pytest.raises(InvalidArgument, match="delta must be a finite decimal number"):
        lim.adjust("a", b, "inf", on_error="open")
    with pytest.raises(TypeError, match="expected a Bucket"):
        lim.consume("a", (10, 1))  # type: ignore[arg-type]


# The grammar error after the limit it names (contract.json, as rendered).
GRAMMAR = ": expected N/unit or N per [k] unit, units: second, minute, hour, day, month, year"


@pytest.mark.parametrize(
    "limit, max_, fill_seconds",
    [
        ("10/minute", 10, 60),
        ("1/second", 1, 1),
        ("100/hour", 100, 3600),
        ("5000/day", 5000, 86400),
        (" 2.5 / second ", 2.5, 1),
        ("1e3/day", 1000, 86400),
        ("10/min", 10, 60),
        ("10 per minute", 10, 60),
        ("100/5minutes", 100, 300),
        ("100 per 5 minutes", 100, 300),
        ("7 PER 2 Hrs", 7, 7200),
        ("1/mo", 1, 30 * 86400),
        ("12/year", 12, 360 * 86400),
    ],
)
def test_parse_is_a_burst_of_n_refilled_over_the_period(limit: str, max_: float, fill_seconds: float):
    b = Bucket.parse(limit, name="user")
    assert (b.max, b.name) == (max_, "user")
    assert b.rate == max_ / fill_seconds
    assert b.fill_seconds == pytest.approx(fill_seconds)


def test_parse_is_a_token_bucket_not_a_window(module_target: Target):
    """10/minute: all 10 at once, then one every 6 s; not 10 again at the
    next minute's edge."""
    lim = Limiter(module_target.client())
    b = Bucket.parse("10/minute")
    assert [lim.consume("rl:parse", b).allowed for _ in range(11)] == [True] * 10 + [False]
    assert 5000 < lim.peek("rl:parse", b).retry_after_ms <= 6000


@pytest.mark.parametrize(
    "limit, field, message",
    [
        ("10/fortnight", "limit", "invalid limit '10/fortnight'" + GRAMMAR),
        (" 10 perminute ", "limit", "invalid limit '10 perminute'" + GRAMMAR),
        ("/minute", "limit", "invalid limit '/minute'" + GRAMMAR),
        ("10/0 minutes", "limit", "invalid limit '10/0 minutes'" + GRAMMAR),
        ("10/second;1000/day", "limit", "invalid limit '10/second;1000/day'" + GRAMMAR),
        ("10/" + "9" * 5000 + "s", "limit", f"invalid limit '10/{'9' * 5000}s'" + GRAMMAR),
        ("10/mínute", "limit", "invalid limit '10/mínute'" + GRAMMAR),
        ("ten/minute", "max", "max must be a finite decimal number"),
        ("0/minute", "max", "max must be > 0 and <= 1e12"),
        ("-5/second", "max", "max must be > 0 and <= 1e12"),
        ("1/400 years", "rate", "rate is too low for max: max/rate must be <= 1e10 seconds"),
        (10, "limit", "invalid limit '10'" + GRAMMAR),
    ],
)
def test_parse_refuses_anything_else(limit: str, field: str, message: str):
    with pytest.raises(InvalidArgument) as raised:
        Bucket.parse(limit)
    assert (raised.value.field, str(raised.value)) == (field, message)


def test_parse_many_reads_each_limit_of_a_list_in_order():
    buckets = Bucket.parse_many("10/second; 1000/day, 5 per hour|1/y")
    assert [(b.max, b.rate) for b in buckets] == [(10, 10), (1000, 1000 / 86400), (5, 5 / 3600), (1, 1 / (360 * 86400))]
    assert Bucket.parse_many("3/minute") == [Bucket.parse("3/minute")]


@pytest.mark.parametrize(
    "limits, message",
    [
        ("10/second;", "invalid limit ''" + GRAMMAR),
        ("10/second; 1/fortnight", "invalid limit '1/fortnight'" + GRAMMAR),
        (None, "invalid limit 'None'" + GRAMMAR),
    ],
)
def test_parse_many_names_the_limit_it_refuses(limits: str, message: str):
    with pytest.raises(InvalidArgument) as raised:
        Bucket.parse_many(limits)
    assert (raised.value.field, str(raised.value)) == ("limit", message)
