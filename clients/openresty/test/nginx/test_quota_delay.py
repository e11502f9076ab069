"""Calendar quotas and delays at the edge: a quota rule refuses past its
limit with the RateLimit fields naming its period, a quota beside a
concurrency rule takes no slot when it refuses, and with max_delay_ms
a request over the burst waits its turn instead of a 429, on each
backend."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

from conftest import burst, one_limiter


def test_a_quota_rule_refuses_past_its_limit_and_names_its_period(server, r, nginx):
    rule = '{ name = "daily", quota = { limit = 3, period = "day" }, key = "$http_x_user" }'
    n = nginx(one_limiter(server.url, rules=[rule]))
    codes = [x.status for x in burst([(n.port, "/limited")] * 8, {"X-User": "dora"})]
    # Exact across the two workers: a quota never refills within its day.
    assert codes.count(200) == 3 and codes.count(429) == 5
    denied = n.get("/limited", {"X-User": "dora"})
    assert denied.status == 429
    assert denied.headers["ratelimit-policy"] == '"daily";q=3;w=86400'
    # Until the next UTC midnight: at most a day.
    assert 0 < int(denied.headers["retry-after"]) <= 86400
    assert r.hget("rl:daily:dora", "used") == b"3"


def test_a_slot_and_a_quota_are_taken_together_or_not_at_all(server, r, nginx):
    # Room for 8 streams, 3 requests a day: of 8 at once, 3 take a slot and
    # the quota; the 5 the quota refuses hold no slot (no log phase here
    # releases one, so the lease key counts every slot ever taken).
    n = nginx(one_limiter(server.url,
                          rules=['{ name = "daily", quota = { limit = 3, period = "day" }, key = "$http_x_user" }'],
                          concurrency='{ name = "streams", limit = 8, lease_ms = 30000, key = "$http_x_user" }'))  # fmt: skip
    codes = [x.status for x in burst([(n.port, "/limited")] * 8, {"X-User": "finn"})]
    assert codes.count(200) == 3 and codes.count(429) == 5, codes
    assert r.hget("rl:daily:finn", "used") == b"3"
    assert r.hlen("rl:streams:finn") == 3


def test_a_request_over_the_burst_is_delayed_within_max_delay(server, r, nginx):
    # A burst of 2, a token every 100 ms, up to 250 ms of delay: of 5 at
    # once, two pass at once, two wait their turn (100 and 200 ms, in debt
    # down to -max), the fifth is past the debt floor and refused.
    n = nginx(one_limiter(server.url, max_delay_ms=250,
                          rules=['{ name = "paced", max = 2, rate = 10, key = "$http_x_user" }']))  # fmt: skip
    started = time.monotonic()
    res = burst([(n.port, "/limited")] * 5, {"X-User": "eve"}, threads=5)
    elapsed = time.monotonic() - started
    codes = sorted(x.status for x in res)
    assert codes == [200, 200, 200, 200, 429], codes
    # The last admitted went on only after its turn: two tokens' refill.
    assert elapsed >= 0.19, elapsed
    # Without max_delay_ms the same burst is two 200s and three 429s.
    plain = nginx(one_limiter(server.url, rules=['{ name = "plain", max = 2, rate = 10, key = "$http_x_user" }']))
    codes = sorted(x.status for x in burst([(plain.port, "/limited")] * 5, {"X-User": "eve"}, threads=5))
    assert codes == [200, 200, 429, 429, 429], codes


def test_twenty_callers_with_waits_are_paced_at_the_rate(server, r, nginx):
    # A drained bucket of 20 at 10 a second: twenty requests at once are
    # all admitted, each a tenth of a second after the one before.
    n = nginx(one_limiter(server.url, max_delay_ms=5000,
                          rules=['{ name = "fleet", max = 20, rate = 10, key = "$http_x_user" }']))  # fmt: skip
    assert [x.status for x in burst([(n.port, "/limited")] * 20, {"X-User": "fleet"})].count(200) == 20
    started = time.monotonic()

    def timed(_: int) -> tuple[int, float]:
        res = n.get("/limited", {"X-User": "fleet"})
        return res.status, time.monotonic() - started

    with ThreadPoolExecutor(20) as pool:
        done = list(pool.map(timed, range(20)))
    assert [status for status, _ in done] == [200] * 20
    # One token apart, within one token, never faster than the refill.
    times = sorted(t for _, t in done)
    for k, t in enumerate(times):
        assert abs(t - (k + 1) * 0.1) <= 0.1, [round(x, 3) for x in times]
