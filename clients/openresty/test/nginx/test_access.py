"""One decision per request in the access phase, exact across workers and
across nginx instances sharing one Redis, on each backend."""

from __future__ import annotations

import json

import redis
from conftest import LIMITED, SLOW, burst, lua_config, one_limiter


def user_rule(max_: int) -> str:
    return f'{{ name = "user", max = {max_}, rate = {SLOW}, key = "$http_x_user" }}'


IP_RULE = '{ name = "ip", max = 1000, rate = 1, key = "$binary_remote_addr" }'


def test_the_exact_budget_across_two_workers(server, r, nginx):
    n = nginx(one_limiter(server.url, rules=[user_rule(20), IP_RULE]))
    res = burst([(n.port, "/limited")] * 60, {"X-User": "alice"})
    codes = [x.status for x in res]
    assert codes.count(200) == 20 and codes.count(429) == 40
    served_by = {x.headers["x-worker"] for x in res}
    assert len(served_by) == 2, "both workers answered"
    assert n.get("/ready").text.strip() == server.backend


def test_the_exact_budget_across_two_nginx_sharing_one_redis(server, r, nginx):
    a = nginx(one_limiter(server.url, rules=[user_rule(25)]))
    b = nginx(one_limiter(server.url, rules=[user_rule(25)]))
    res = burst([(a.port, "/limited"), (b.port, "/limited")] * 40, {"X-User": "bob"})
    assert [x.status for x in res].count(200) == 25
    # Denials charged nothing: the bucket holds exactly 0.
    assert int(float(r.hget("rl:user:bob", "tokens"))) == 0


def test_several_buckets_all_or_nothing(server, r, nginx):
    n = nginx(one_limiter(server.url, rules=[user_rule(3), '{ name = "ip", max = 2, rate = 0.001, '
                                             'key = "$binary_remote_addr" }']))  # fmt: skip
    assert [n.get("/limited", {"X-User": u}).status for u in ("a", "b", "c")] == [200, 200, 429]
    # The ip bucket denied the third: user c's bucket was not charged.
    assert r.exists("rl:user:c") == 0


def test_the_fields_and_the_problem_body(server, r, nginx):
    n = nginx(one_limiter(server.url, rules=['{ name = "user", max = 2, rate = 0.5, key = "$http_x_user" }']))
    ok = n.get("/limited", {"X-User": "carol"})
    assert ok.status == 200
    assert ok.headers["ratelimit-policy"] == '"user";q=2;w=4'
    assert ok.headers["ratelimit"] == '"user";r=1;t=2'
    n.get("/limited", {"X-User": "carol"})
    denied = n.get("/limited", {"X-User": "carol"})
    assert denied.status == 429
    assert denied.headers["content-type"] == "application/problem+json"
    assert denied.headers["retry-after"] == "2"
    assert denied.headers["ratelimit"] == '"user";r=0;t=2'
    assert (
        denied.body
        == json.dumps(
            {
                "type": "https://iana.org/assignments/http-problem-types#quota-exceeded",
                "title": "Request cannot be satisfied as assigned quota has been exceeded",
                "status": 429,
                "detail": "Rate limited by user: retry in 2 s.",
                "violated-policies": ["user"],
            },
            separators=(",", ":"),
        ).encode()
    )


def test_keys_from_a_lua_function_with_a_tier_and_a_cost(server, r, nginx):
    limits = lua_config(
        server.url,
        rules=[
            '{ name = "llm", bucket = function(ctx) return TIERS[ngx.var.http_x_tier] end, '
            "key = function(ctx) return ngx.var.http_x_user end, "
            "cost = function(ctx) return tonumber(ngx.var.http_x_tokens) end }"
        ],
    )
    init = "TIERS = { free = { max = 100, rate = 0.001 }, pro = { max = 1000, rate = 0.001 } }\n" + (
        f'limit = require("resty.tokenbucket").new({limits})'
    )
    n = nginx(init)
    assert n.get("/limited", {"X-User": "d", "X-Tier": "free", "X-Tokens": "60"}).status == 200
    assert n.get("/limited", {"X-User": "d", "X-Tier": "free", "X-Tokens": "60"}).status == 429
    # No tier: the bucket function gives nil and the rule is skipped.
    assert n.get("/limited", {"X-User": "d", "X-Tokens": "60"}).status == 200
    assert int(float(r.hget("rl:llm:d", "tokens"))) == 40


def test_the_eval_script_where_function_is_refused(server, r, nginx):
    r.execute_command("ACL", "SETUSER", "edge", "on", ">secret", "~*", "&*", "+@all", "-function")
    try:
        url = server.url.replace("redis://", "redis://edge:secret@")
        n = nginx(one_limiter(url, rules=[user_rule(2)]))
        codes = [n.get("/limited", {"X-User": "e"}).status for _ in range(3)]
        assert codes == [200, 200, 429]
        expected = "module" if server.backend == "module" else "eval"
        assert n.get("/ready").text.strip() == expected
    finally:
        r.execute_command("ACL", "DELUSER", "edge")


def test_a_denied_client_in_a_retry_loop_costs_redis_one_call(server, r, nginx):
    n = nginx(one_limiter(server.url, denial_cache=1000, rules=[user_rule(1)]), workers=1)
    assert n.get("/limited", {"X-User": "f"}).status == 200
    r.config_resetstat()
    codes = [n.get("/limited", {"X-User": "f"}).status for _ in range(30)]
    assert codes == [429] * 30
    stats = r.info("commandstats")
    calls = sum(v["calls"] for k, v in stats.items() if k.startswith(("cmdstat_tb.", "cmdstat_fcall")))
    assert calls == 1, stats


def test_a_wrong_password_is_a_500_named_in_the_log(server, r, nginx):
    url = server.url.replace("redis://", "redis://nobody:wrong@")
    n = nginx(one_limiter(url, on_error="open", rules=[user_rule(2)]))
    for _ in range(10):
        res = n.get("/limited", {"X-User": "g"})
        assert res.status == 500
        assert res.json()["detail"] == "The rate limiter failed: see the error log."
    assert len(n.log_lines("WRONGPASS")) == 1, "named once, not once per request"


def test_a_bad_rule_stops_nginx_at_startup(server, nginx):
    try:
        nginx(one_limiter(server.url, rules=['{ name = "user", max = 0, rate = 1, key = "$http_x_user" }']))
    except RuntimeError as e:
        assert "rule user: max must be > 0 and <= 1e12" in str(e)
    else:
        raise AssertionError("nginx started with a bad rule")


def test_redis_keeps_no_key_for_a_request_nothing_charged(server, r: redis.Redis, nginx):
    n = nginx(one_limiter(server.url, rules=[user_rule(1)]))
    assert n.get("/limited", {"X-User": "h"}).status == 200
    assert r.keys("rl:*") == [b"rl:user:h"]


# The events of on_decision, counted per rule and outcome in the shared
# dict (both workers), and read back.
COUNT_EVENTS = "on_decision = function(e) ngx.shared.tokenbucket:incr('ev:' .. e.policy .. ':' .. e.outcome, 1, 0) end"
EVENTS = """
        location = /events {
            content_by_lua_block {
                for _, k in ipairs(ngx.shared.tokenbucket:get_keys(0)) do
                    if k:sub(1, 3) == "ev:" then ngx.say(k:sub(4), " ", ngx.shared.tokenbucket:get(k)) end
                end
            }
        }
"""


def events_of(n) -> dict[str, int]:
    lines = n.get("/events").text.split("\n")
    return {k: int(v) for k, v in (line.split(" ") for line in lines if line)}


def test_a_shadow_rule_is_charged_beside_and_never_refuses(server, r, nginx):
    trial = f'{{ name = "trial", max = 1, rate = {SLOW}, key = "$http_x_user", shadow = true }}'
    limits = lua_config(server.url, rules=[user_rule(2), trial]).removesuffix("\n}") + ",\n  " + COUNT_EVENTS + "\n}"
    n = nginx(f'limit = require("resty.tokenbucket").new({limits})', LIMITED + EVENTS)
    answers = [n.get("/limited", {"X-User": "erin"}) for _ in range(3)]
    assert [a.status for a in answers] == [200, 200, 429]
    # The shadow rule puts no fields on the response and names no policy.
    assert answers[1].headers["ratelimit-policy"] == '"user";q=2;w=2000'
    assert answers[2].json()["violated-policies"] == ["user"]
    # Its denial did not stop the enforced charge, and it was counted for
    # every request, the refused one too.
    assert events_of(n) == {
        "user:within_limit": 1,
        "user:near_limit": 1,
        "user:over_limit": 1,
        "trial:near_limit": 1,
        "trial:shadow_mode": 2,
    }
    assert r.exists("rl:trial:erin") == 1
    assert n.log_lines("shadow mode let through a request trial would deny")
    # Without its identity the shadow rule is skipped, never a 400 (the
    # enforced rule is optional here).
    optional = '{ name = "user", max = 2, rate = 0.001, key = "$http_x_user", optional = true }'
    trial_ip = f'{{ name = "trial", max = 1, rate = {SLOW}, key = "$http_x_trial", shadow = true }}'
    m = nginx(one_limiter(server.url, rules=[optional, trial_ip]))
    assert m.get("/limited", {"X-User": "fay"}).status == 200


def test_a_shadow_limiter_answers_200_past_the_limit(server, r, nginx):
    limits = lua_config(server.url, rules=[user_rule(1)], shadow=True).removesuffix("\n}") + ",\n  " + COUNT_EVENTS
    n = nginx(f'limit = require("resty.tokenbucket").new({limits}\n}})', LIMITED + EVENTS)
    assert [n.get("/limited", {"X-User": "gus"}).status for _ in range(3)] == [200, 200, 200]
    assert events_of(n) == {"user:near_limit": 1, "user:shadow_mode": 2}
