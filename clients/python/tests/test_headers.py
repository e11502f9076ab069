"""The HTTP fields of a decision, exactly."""

from __future__ import annotations

from conftest import SLOW, Target

from redis_tokenbucket import Bucket, Decision, Limiter, MultiDecision, rate_limit_headers

USER = Bucket(10, 0.17, name="user")
IP = Bucket(600, 30, name="ip")


def decision(bucket: Bucket, allowed: bool, remaining: int, retry: int, reset: int) -> Decision:
    return Decision(allowed, remaining, retry, reset, "k", bucket, 1)


def test_one_bucket_admitted():
    # 10 at 0.17/s: 59 s to refill all; 1 token used, full again in 5883 ms.
    headers = rate_limit_headers(decision(USER, True, 9, 0, 5883))
    assert headers == {"RateLimit-Policy": '"user";q=10;w=59', "RateLimit": '"user";r=9;t=6'}


def test_one_bucket_denied_has_retry_after_rounded_up():
    for retry_ms, seconds in [(1, "1"), (999, "1"), (1000, "1"), (1001, "2"), (5883, "6")]:
        headers = rate_limit_headers(decision(USER, False, 0, retry_ms, 58_000))
        assert headers["Retry-After"] == seconds
        assert headers["RateLimit"] == f'"user";r=0;t={seconds}'


def test_several_buckets_in_order_with_the_legacy_fields():
    m = MultiDecision(
        False,
        4000,
        (
            decision(USER, True, 3, 0, 41_177),
            decision(IP, False, 0, 4000, 20_000),
            decision(Bucket(2.5, 0.5), True, -3, 0, 11_000),
        ),
    )
    assert rate_limit_headers(m, legacy=True) == {
        "RateLimit-Policy": '"user";q=10;w=59, "ip";q=600;w=20, "default";q=2;w=5',
        # t: the denying bucket's retry, the others' time until full; debt shows as 0 left.
        "RateLimit": '"user";r=3;t=42, "ip";r=0;t=4, "default";r=0;t=11',
        # The legacy pair describes the tightest bucket: the denying one.
        "X-RateLimit-Limit": "600",
        "X-RateLimit-Remaining": "0",
        "Retry-After": "4",
    }
    assert m.tightest.bucket is IP and [d.bucket.name for d in m.denied_by] == ["ip"]


def test_tightest_admitted_bucket_is_the_emptiest_share():
    m = MultiDecision(True, 0, (decision(USER, True, 2, 0, 1), decision(IP, True, 200, 0, 1)))
    headers = rate_limit_headers(m, legacy=True)
    assert (headers["X-RateLimit-Limit"], headers["X-RateLimit-Remaining"]) == ("10", "2")  # 2/10 < 200/600
    assert "Retry-After" not in headers


def test_names_are_structured_field_strings():
    b = Bucket(1, 1, name='a "quoted" \\ name')
    assert rate_limit_headers(decision(b, True, 0, 0, 1000))["RateLimit"] == '"a \\"quoted\\" \\\\ name";r=0;t=1'


def test_a_degraded_decision_has_nothing_to_report():
    d = Decision(True, 0, 0, 0, "k", USER, 1, degraded=True)
    assert rate_limit_headers(d) == {}
    assert rate_limit_headers(MultiDecision(False, 0, (d,), degraded=True)) == {}


def test_from_a_real_call(target: Target):
    lim = Limiter(target.client())
    b = Bucket(3, SLOW, name="user")
    for _ in range(3):
        lim.consume("rl:user:7", b)
    headers = rate_limit_headers(lim.consume("rl:user:7", b), legacy=True)
    # Just under 1000 s until one token is back: 1000 s rounded up.
    assert headers == {
        "RateLimit-Policy": '"user";q=3;w=3000',
        "RateLimit": '"user";r=0;t=1000',
        "X-RateLimit-Limit": "3",
        "X-RateLimit-Remaining": "0",
        "Retry-After": "1000",
    }


def test_a_bucket_below_one_token_states_a_quota_of_one():
    """max 0.5 admits costs up to 0.5: a quota of 0 would say nothing passes."""
    half = Bucket(0.5, 1, name="tiny")
    headers = rate_limit_headers(decision(half, True, 0, 0, 500), legacy=True)
    assert headers["RateLimit-Policy"] == '"tiny";q=1;w=1'
    assert headers["X-RateLimit-Limit"] == "1"
    assert rate_limit_headers(decision(Bucket(2.5, 1), True, 1, 0, 500))["RateLimit-Policy"] == '"default";q=2;w=3'


def test_a_shed_decision_has_nothing_to_report():
    d = Decision(False, 0, 0, 0, "k", USER, 1, shed=True)
    assert rate_limit_headers(d) == {}
    assert rate_limit_headers(MultiDecision(False, 0, (d,), shed=True)) == {}


def test_adjust_into_debt_is_not_admitted(target: Target):
    """TB.ADJUST always replies allowed=1; the decision says whether the
    next request of cost 1 would pass, so a retry time comes with a denial,
    as on every other call."""
    lim = Limiter(target.client())
    b = Bucket(5, 1, name="user")
    refund = lim.adjust("rl:debt", b, 1)
    assert (refund.allowed, refund.retry_after_ms) == (True, 0)
    debt = lim.adjust("rl:debt", b, -8)
    assert debt.remaining == -3 and not debt.allowed and debt.retry_after_ms > 3000
    assert rate_limit_headers(debt)["Retry-After"] == str(debt.retry_after)
    assert lim.adjust("rl:debt", b, 10).allowed
