"""A rule's penalty (`block_ms`), a rule that always denies (`deny`), and
trusted callers who skip a rule (`skip`), through nginx."""

from __future__ import annotations

from conftest import one_limiter

# 1 token, refilled at 0.01/s: a denial at an empty bucket waits 100 s.
TINY = 'name = "key", max = 1, rate = 0.01, key = "$http_x_key"'


def test_a_denial_is_blocked_for_the_rules_block_ms_once(server, r, nginx):
    n = nginx(one_limiter(server.url, rules=[f"{{ {TINY}, block_ms = 150000 }}"]))
    assert n.get("/limited", {"X-Key": "k1"}).status == 200
    assert float(r.hget("rl:key:k1", "tokens")) < 0.01  # the admitted call paid its token, no penalty
    denied = n.get("/limited", {"X-Key": "k1"})
    assert denied.status == 429
    # The wait was 100 s; the penalty makes it 150 s: 0.5 token of debt.
    assert denied.headers["retry-after"] == "150"
    assert -0.51 < float(r.hget("rl:key:k1", "tokens")) < -0.49
    # Denied again inside the block: the bucket in debt, nothing more charged.
    again = n.get("/limited", {"X-Key": "k1"})
    assert again.status == 429 and int(again.headers["retry-after"]) <= 150
    assert -0.51 < float(r.hget("rl:key:k1", "tokens")) < -0.49


def test_a_deny_rule_refuses_without_redis_and_a_trusted_caller_skips_it(server, r, nginx):
    rules = [
        '{ name = "banned", deny = true, key = "$http_x_peer", skip = { "198.51.100.9" } }',
        f"{{ {TINY}, optional = true }}",
    ]
    n = nginx(one_limiter(server.url, rules=rules))
    denied = n.get("/limited", {"X-Peer": "198.51.100.7", "X-Key": "k1"})
    assert denied.status == 429 and denied.headers["content-type"] == "application/problem+json"
    assert denied.headers["retry-after"] == "3600"
    assert denied.headers["ratelimit-policy"] == '"banned";q=0'
    assert denied.headers["ratelimit"] == '"banned";r=0;t=3600'
    assert denied.json()["violated-policies"] == ["banned"]
    assert r.dbsize() == 0  # nothing was sent
    ok = n.get("/limited", {"X-Peer": "198.51.100.9", "X-Key": "k1"})
    assert ok.status == 200 and ok.headers["ratelimit-policy"].startswith('"key";q=1')
