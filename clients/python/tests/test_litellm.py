"""The LiteLLM proxy hook (redis_tokenbucket.litellm) against the real
proxy: two `litellm --config` instances sharing one Redis, with the
module and with the Lua library only, offline (tblitellm.py). Runs in
`make test-litellm`'s venv, which has litellm; skipped elsewhere.

LiteLLM keeps virtual keys, users and teams, and the limits stored on
them, in its database, which needs Prisma engines that can't be had
here. The tests of those limits build LiteLLM's own UserAPIKeyAuth (what
the proxy's auth hands every hook) and call the hook as the proxy does:
async_pre_call_hook before the call, then the success or failure hook.
"""

from __future__ import annotations

import asyncio
import datetime
import importlib.util
import os
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

if importlib.util.find_spec("litellm") is None:
    pytest.skip("litellm is not installed: `make test-litellm` runs these", allow_module_level=True)
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # never fetch the cost map

import httpx
import redis
import redis.asyncio
from conftest import run
from fastapi import HTTPException
from litellm.proxy._types import UserAPIKeyAuth
from tblitellm import AUTH, Proxy, Stub, chat, config, start_proxies
from tbservers import Cluster, Server

from redis_tokenbucket import Bucket, Limiter
from redis_tokenbucket.asyncio import Limiter as AsyncLimiter
from redis_tokenbucket.litellm import RulesError, TokenBucketHook, load, parse

END_USER_RPM, END_USER_TPM, SLOW_PARALLEL, CAPPED_RPM = 10, 1200, 3, 6


def rules(port: int, **more: Any) -> dict[str, Any]:
    return {
        "redis_url": f"redis://127.0.0.1:{port}/0",
        "on_error": "closed",
        "default_max_tokens": 50,
        "tiers": {
            "default": {
                "end_user": {"rpm": END_USER_RPM, "tpm": END_USER_TPM},
                "model": {"slow": {"parallel": SLOW_PARALLEL}},
            }
        },
        "models": {"capped": {"rpm": CAPPED_RPM}},
        **more,
    }


@dataclass
class Deployment:
    redis: Server
    proxies: list[Proxy]
    backend: str

    def limiter(self) -> Limiter:
        return Limiter(redis.Redis(port=self.redis.port))


@pytest.fixture(scope="session")
def stub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stub]:
    s = Stub(tmp_path_factory.mktemp("stub"))
    yield s
    s.stop()


@pytest.fixture(scope="module", params=["module", "library"])
def deployment(
    request: pytest.FixtureRequest, stub: Stub, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Deployment]:
    module = request.param == "module"
    workdir = tmp_path_factory.mktemp(f"litellm-{request.param}")
    server = Server("redis-7.0", workdir / "redis", module=module).start()
    try:
        proxies = start_proxies(workdir, config(stub), [rules(server.port)] * 2)
    except BaseException:
        server.stop()
        raise
    yield Deployment(server, proxies, "module" if module else "functions")
    for p in proxies:
        p.stop()
    server.stop()


async def post_all(bodies: list[tuple[Proxy, dict[str, Any]]]) -> list[httpx.Response]:
    async with httpx.AsyncClient(timeout=30, headers=AUTH) as client:
        return list(await asyncio.gather(*(client.post(f"{p.url}/v1/chat/completions", json=b) for p, b in bodies)))


def test_concurrent_requests_across_two_instances_stay_within_each_budget(deployment: Deployment):
    a, b = deployment.proxies
    users = ["alice", "bob", "carol"]
    bodies = [((a, b)[i % 2], chat("fast", user)) for user in users for i in range(END_USER_RPM + 8)]
    answers = run(post_all(bodies))
    admitted = Counter(body["user"] for (_, body), r in zip(bodies, answers, strict=True) if r.status_code == 200)
    for user in users:
        # The budget, plus at most the token the refill brings while the test runs.
        assert END_USER_RPM <= admitted[user] <= END_USER_RPM + 1, (user, admitted)
    denied = [r for r in answers if r.status_code != 200]
    assert denied and all(r.status_code == 429 for r in denied), Counter(r.status_code for r in answers)
    for r in answers:
        if r.status_code == 200:  # what the limit had left, as LiteLLM's own limiter says on a 200
            assert r.headers["x-ratelimit-end_user-limit-requests"] == str(END_USER_RPM)
            assert 0 <= int(r.headers["x-ratelimit-end_user-remaining-requests"]) < END_USER_RPM
    for r in denied:
        assert int(r.headers["retry-after"]) >= 1
        assert r.headers["rate_limit_type"] == "requests"
        assert r.headers["x-ratelimit-end_user-limit-requests"] == str(END_USER_RPM)
        assert r.headers["x-ratelimit-remaining-requests"] == "0"
        assert "end_user" in r.json()["error"]["message"]
    with deployment.limiter() as lim:
        lim.detect()
        assert lim.backend == deployment.backend


def test_a_model_cap_holds_for_all_callers_across_both_instances(deployment: Deployment):
    a, b = deployment.proxies
    bodies = [((a, b)[i % 2], chat("capped", f"caller-{i}")) for i in range(20)]
    answers = run(post_all(bodies))
    codes = Counter(r.status_code for r in answers)
    assert CAPPED_RPM <= codes[200] <= CAPPED_RPM + 1 and codes[200] + codes[429] == 20, codes
    denied = next(r for r in answers if r.status_code == 429)
    assert denied.headers["x-ratelimit-deployment-limit-requests"] == str(CAPPED_RPM)
    assert "deployment" in denied.json()["error"]["message"]


def test_parallel_streams_are_capped_and_a_dropped_stream_frees_its_slot_at_once(deployment: Deployment):
    a, b = deployment.proxies

    async def scenario() -> None:
        async with httpx.AsyncClient(timeout=30, headers=AUTH) as client:
            streams = []
            for i in range(SLOW_PARALLEL):
                req = client.build_request("POST", f"{(a, b)[i % 2].url}/v1/chat/completions",
                                           json=chat("slow", f"streamer-{i}", stream=True))  # fmt: skip
                resp = await client.send(req, stream=True)
                assert resp.status_code == 200
                lines = resp.aiter_lines()
                await lines.__anext__()  # the stream is running (the iterator kept: dropping it closes the stream)
                streams.append((resp, lines))
            over = await client.post(f"{b.url}/v1/chat/completions", json=chat("slow", "streamer-x", stream=True))
            assert over.status_code == 429, over.text
            assert over.headers["rate_limit_type"] == "max_parallel_requests"
            assert over.headers["x-ratelimit-model-remaining-max_parallel_requests"] == "0"
            with deployment.limiter() as lim:
                (key,) = [k.decode() for k in lim.client.scan_iter("llm:model:parallel:*")]
                assert lim.in_flight(key) == SLOW_PARALLEL
                await streams[0][0].aclose()  # the client goes away mid-stream
                # Well before the lease's 30 s expiry: the drop released it.
                for _ in range(100):
                    if lim.in_flight(key) == SLOW_PARALLEL - 1:
                        break
                    await asyncio.sleep(0.05)
                assert lim.in_flight(key) == SLOW_PARALLEL - 1
                again = await client.post(f"{a.url}/v1/chat/completions", json=chat("slow", "streamer-y", stream=True))
                assert again.status_code == 200  # read to its end: its slot is released there
                for resp, _ in streams[1:]:
                    await resp.aclose()
                for _ in range(100):
                    if lim.in_flight(key) == 0:
                        break
                    await asyncio.sleep(0.05)
                assert lim.in_flight(key) == 0

    run(scenario())


def test_a_failed_upstream_call_refunds_and_a_success_is_charged_its_usage(deployment: Deployment):
    a, b = deployment.proxies
    # Each asks for most of the user's 1200 tokens a minute (20 a second back):
    # had the failure kept its reservation, the next would be refused.
    big = END_USER_TPM - 100

    def one(proxy: Proxy, model: str, **more: Any) -> httpx.Response:
        return run(post_all([(proxy, chat(model, "dave", max_tokens=big, **more))]))[0]

    assert one(a, "fail").status_code == 500
    assert one(b, "fast").status_code == 200  # the refund landed; this one is settled to its ~10 tokens
    streamed = one(a, "fast", stream=True)
    assert streamed.status_code == 200 and "[DONE]" in streamed.text  # settled at its end
    assert one(b, "fast").status_code == 200
    over = run(post_all([(a, chat("fast", "dave", max_tokens=big)), (b, chat("fast", "dave", max_tokens=big))]))
    # Two reservations at once don't both fit: tokens hold across instances.
    assert sorted(r.status_code for r in over) == [200, 429]
    assert next(r for r in over if r.status_code == 429).headers["rate_limit_type"] == "tokens"


# ---- Redis stopped: each policy holds --------------------------------------------------


@pytest.mark.parametrize("module", [True, False], ids=["module", "library"])
def test_redis_stopped_each_policy_holds(stub: Stub, tmp_path: Path, module: bool):
    server = Server("redis-7.0", tmp_path / "redis", module=module).start()
    policies = ["open", "closed", "local"]
    per_policy = [rules(server.port, on_error=p, timeout=0.2) for p in policies]
    try:
        proxies = start_proxies(tmp_path, config(stub), per_policy)
    except BaseException:
        server.stop()
        raise
    try:
        by_policy = dict(zip(policies, proxies, strict=True))
        ok = run(post_all([(p, chat("fast", "erin")) for p in proxies]))
        assert [r.status_code for r in ok] == [200, 200, 200]
        server.stop()
        n = END_USER_RPM + 3
        for policy, proxy in by_policy.items():
            codes = [r.status_code for r in run(post_all([(proxy, chat("fast", "frank"))] * n))]
            if policy == "open":
                assert codes == [200] * n  # unlimited while Redis is down
            elif policy == "closed":
                assert codes == [503] * n
            else:
                # The proxy's own bucket (processes: 1): the budget, then 429.
                assert Counter(codes) == Counter({200: END_USER_RPM, 429: 3}), codes
        closed = run(post_all([(by_policy["closed"], chat("fast", "frank"))]))[0]
        assert int(closed.headers["retry-after"]) >= 1
        # Redis back (empty, on the same port): exact again once the breaker's
        # cooldown (2 s by default) has passed and one call has probed (the
        # calls beside a probe get the policy's answer), whatever the policy.
        server.restart()
        time.sleep(2.5)
        for policy, proxy in by_policy.items():
            probe = run(post_all([(proxy, chat("fast", f"probe-{policy}"))]))[0]
            assert probe.status_code == 200, (policy, probe.text)
            codes = [r.status_code for r in run(post_all([(proxy, chat("fast", f"grace-{policy}"))] * n))]
            assert Counter(codes) == Counter({200: END_USER_RPM, 429: 3}), (policy, codes)
    finally:
        for p in proxies:
            p.stop()
        server.stop()


@pytest.mark.parametrize("module", [True, False], ids=["module", "library"])
def test_a_proxy_killed_mid_stream_frees_its_slots_when_the_leases_expire(stub: Stub, tmp_path: Path, module: bool):
    server = Server("redis-7.0", tmp_path / "redis", module=module).start()
    try:
        (proxy,) = start_proxies(tmp_path, config(stub), [rules(server.port, lease_ms=3000)])
    except BaseException:
        server.stop()
        raise

    async def scenario() -> None:
        async with httpx.AsyncClient(timeout=30, headers=AUTH) as client:
            streams = []
            for i in range(SLOW_PARALLEL):
                req = client.build_request(
                    "POST", f"{proxy.url}/v1/chat/completions", json=chat("slow", f"killed-{i}", stream=True)
                )
                resp = await client.send(req, stream=True)
                assert resp.status_code == 200
                lines = resp.aiter_lines()
                await lines.__anext__()  # streaming (the iterator kept: dropping it would close the stream)
                streams.append(lines)
            with Limiter(server.client()) as lim:
                (key,) = [k.decode() for k in lim.client.scan_iter("llm:model:parallel:*")]
                assert lim.in_flight(key) == SLOW_PARALLEL
                proxy.stop()  # SIGKILL: no hook runs, nothing is released
                assert lim.in_flight(key) == SLOW_PARALLEL
                for _ in range(150):
                    if lim.in_flight(key) == 0:
                        break
                    await asyncio.sleep(0.1)
                assert lim.in_flight(key) == 0  # expired, no slot leaked

    try:
        run(scenario())
    finally:
        proxy.stop()
        server.stop()


def test_malformed_rules_stop_the_proxy_at_start_naming_the_file_and_field(stub: Stub, tmp_path: Path):
    bad = rules(6379)
    bad["tiers"]["default"]["end_user"]["rpm"] = 0
    proxy = Proxy(tmp_path, config(stub), bad)
    try:
        with pytest.raises(RuntimeError) as failed:
            proxy.wait()
    finally:
        proxy.stop()
    assert f"{tmp_path / 'rules.yaml'}: tiers.default.end_user: rpm must be a whole number >= 1, got 0" in str(
        failed.value
    )


# ---- Limits LiteLLM stores on keys, users and teams (its database) -----------------------
# Built as the proxy's auth builds them, and the hook called as the proxy calls it.


@pytest.fixture(scope="module", params=["module", "library"])
def db_redis(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    module = request.param == "module"
    server = Server("redis-7.0", tmp_path_factory.mktemp(f"db-redis-{request.param}"), module=module).start()
    yield server
    server.stop()


def hook_on(server: Server, **more: Any) -> TokenBucketHook:
    with server.client() as admin:
        admin.flushall()
    spec = parse({"redis_url": server.url, "on_error": "closed", **more}, "test")
    return TokenBucketHook(spec, AsyncLimiter(redis.asyncio.Redis(port=server.port)))


def request(model: str = "fast", **more: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hello there"}], **more}


async def admit(hook: TokenBucketHook, auth: UserAPIKeyAuth, data: dict[str, Any]) -> dict[str, Any]:
    return dict(await hook.async_pre_call_hook(user_api_key_dict=auth, cache=None, data=data, call_type="acompletion"))


async def refused(hook: TokenBucketHook, auth: UserAPIKeyAuth, data: dict[str, Any]) -> HTTPException:
    with pytest.raises(HTTPException) as denied:
        await admit(hook, auth, data)
    return denied.value


def test_a_keys_stored_rpm_limit_is_used(db_redis: Server):
    async def body() -> None:
        hook = hook_on(db_redis)
        auth = UserAPIKeyAuth(api_key="sk-virtual-1", rpm_limit=2)
        left = []
        for _ in range(2):
            data = await admit(hook, auth, request())
            headers = await hook.async_post_call_response_headers_hook(data, auth, None)
            assert headers is not None and headers["x-ratelimit-key-limit-requests"] == "2"
            left.append(headers["x-ratelimit-key-remaining-requests"])
            assert await hook.async_post_call_response_headers_hook(data, auth, None) is None  # once
        assert left == ["1", "0"]
        denied = await refused(hook, auth, request())
        assert denied.status_code == 429
        assert denied.headers["rate_limit_type"] == "requests"
        assert denied.headers["x-ratelimit-key-limit-requests"] == "2"
        assert "key" in str(denied.detail)
        # Another key is not limited by this one's.
        await admit(hook, UserAPIKeyAuth(api_key="sk-virtual-2", rpm_limit=2), request())

    run(body())


def test_max_parallel_requests_is_a_slot_released_by_the_failure_hook(db_redis: Server):
    async def body() -> None:
        hook = hook_on(db_redis)
        auth = UserAPIKeyAuth(api_key="sk-virtual-3", max_parallel_requests=1)
        first = await admit(hook, auth, request(litellm_call_id="call-1"))
        denied = await refused(hook, auth, request(litellm_call_id="call-2"))
        assert denied.status_code == 429 and denied.headers["rate_limit_type"] == "max_parallel_requests"
        await hook.async_post_call_failure_hook(first, Exception("upstream timed out"), auth)
        second = await admit(hook, auth, request(litellm_call_id="call-3"))
        assert not hook.open.keys() - {"call-3"}
        await hook.async_post_call_success_hook(second, auth, {"usage": {"total_tokens": 5}})
        assert hook.open == {}

    run(body())


def test_response_headers_not_asked_for_are_dropped_once_stale(db_redis: Server):
    async def body() -> None:
        hook = hook_on(db_redis, max_request_s=0.05)
        auth = UserAPIKeyAuth(api_key="sk-stale", rpm_limit=5)
        first = await admit(hook, auth, request())
        assert list(hook.headers) == [first["litellm_call_id"]]
        await asyncio.sleep(0.1)
        second = await admit(hook, auth, request())  # the first one's fields are stale: gone
        assert list(hook.headers) == [second["litellm_call_id"]]
        assert await hook.async_post_call_response_headers_hook(first, auth, None) is None

    run(body())


def test_a_keys_tpm_limit_reserves_and_settles_on_usage(db_redis: Server):
    async def body() -> None:
        hook = hook_on(db_redis)
        auth = UserAPIKeyAuth(api_key="sk-virtual-4", tpm_limit=1000)
        first = await admit(hook, auth, request(max_tokens=900))
        denied = await refused(hook, auth, request(max_tokens=900))  # 900 more don't fit
        assert denied.headers["rate_limit_type"] == "tokens"
        assert denied.headers["x-ratelimit-key-limit-tokens"] == "1000"
        await hook.async_post_call_success_hook(first, auth, {"usage": {"total_tokens": 40}})
        # Settled to 40: 900 fit again.
        second = await admit(hook, auth, request(max_tokens=900))
        # It used more than it reserved: charged into debt, so a small one waits.
        await hook.async_post_call_success_hook(second, auth, {"usage": {"total_tokens": 1500}})
        late = await refused(hook, auth, request(max_tokens=10))
        assert late.headers["rate_limit_type"] == "tokens" and int(late.headers["retry-after"]) > 1

    run(body())


def test_team_user_and_per_model_limits_from_the_key(db_redis: Server):
    async def body() -> None:
        hook = hook_on(db_redis)
        a = UserAPIKeyAuth(api_key="sk-team-a", team_id="team-1", team_rpm_limit=1)
        b = UserAPIKeyAuth(api_key="sk-team-b", team_id="team-1", team_rpm_limit=1)
        await admit(hook, a, request())
        denied = await refused(hook, b, request())  # another key, the same team
        assert "team" in str(denied.detail) and denied.headers["x-ratelimit-team-limit-requests"] == "1"
        u = UserAPIKeyAuth(api_key="sk-user", user_id="user-9", user_tpm_limit=100)
        await admit(hook, u, request(max_tokens=80))
        assert "user" in str((await refused(hook, u, request(max_tokens=80))).detail)
        m = UserAPIKeyAuth(api_key="sk-model", rpm_limit_per_model={"fast": 1})
        await admit(hook, m, request("fast"))
        assert (await refused(hook, m, request("fast"))).headers["x-ratelimit-model-limit-requests"] == "1"
        await admit(hook, m, request("slow"))  # another model group

    run(body())


def test_tiers_from_key_metadata(db_redis: Server):
    async def body() -> None:
        tiers = {"default": {"key": {"rpm": 1}}, "pro": {"key": {"rpm": 3}}}
        hook = hook_on(db_redis, tiers=tiers)
        free = UserAPIKeyAuth(api_key="sk-free")
        pro = UserAPIKeyAuth(api_key="sk-pro", metadata={"tier": "pro"})
        await admit(hook, free, request())
        await refused(hook, free, request())
        for _ in range(3):
            await admit(hook, pro, request())
        await refused(hook, pro, request())

    run(body())


def test_bad_input_is_a_400_naming_it_and_a_huge_max_tokens_reserves_the_whole_budget(db_redis: Server):
    async def body() -> None:
        hook = hook_on(db_redis, require=["user"])
        nobody = UserAPIKeyAuth(api_key="sk-anon", tpm_limit=1000)
        missing = await refused(hook, nobody, request())
        assert missing.status_code == 400 and "no user" in str(missing.detail)
        hook = hook_on(db_redis)
        for bad in (-1, "many", True):
            wrong = await refused(hook, nobody, request(max_tokens=bad))
            assert wrong.status_code == 400 and "max_tokens" in str(wrong.detail)
        assert (await refused(hook, nobody, {"messages": []})).status_code == 400  # no model
        await admit(hook, nobody, request(max_tokens=10**9))  # reserves all of the 1000
        assert (await refused(hook, nobody, request(max_tokens=1))).headers["rate_limit_type"] == "tokens"

    run(body())


def clear_of_midnight(*offsets_min: int) -> None:
    """Waits out the last half minute of a day at UTC and at each offset, so
    that a test's period doesn't end under it."""
    for offset in (0, *offsets_min):
        into_day = (time.time() + offset * 60) % 86400
        if into_day > 86400 - 30:
            time.sleep(86400 - into_day + 1)


def test_calendar_budgets_reserve_settle_and_refund_within_the_period(db_redis: Server):
    clear_of_midnight(60)

    async def body() -> None:
        budgets = [{"tokens": 1000, "per": "day"}, {"requests": 3, "per": "month", "offset": 60}]
        hook = hook_on(db_redis, tiers={"default": {"key": {"budgets": budgets}}})
        auth = UserAPIKeyAuth(api_key="sk-budget")
        first = await admit(hook, auth, request(max_tokens=900))
        denied = await refused(hook, auth, request(max_tokens=900))  # 900 more don't fit today
        assert denied.headers["rate_limit_type"] == "tokens"
        assert denied.headers["x-ratelimit-key-limit-tokens-day"] == "1000"
        assert "1000 tokens a day" in str(denied.detail)
        # A quota doesn't refill: the wait is until the next UTC midnight.
        now = datetime.datetime.now(datetime.timezone.utc)
        midnight = datetime.datetime.combine(now.date() + datetime.timedelta(days=1), datetime.time(), now.tzinfo)
        assert abs(int(denied.headers["retry-after"]) - (midnight - now).total_seconds()) <= 2
        # Settled to its usage, the rest of the day's budget is back.
        await hook.async_post_call_success_hook(first, auth, {"usage": {"total_tokens": 40}})
        second = await admit(hook, auth, request(max_tokens=900))
        # A failed call gives its whole reservation back.
        await hook.async_post_call_failure_hook(second, Exception("upstream 500"), auth)
        third = await admit(hook, auth, request(max_tokens=900))
        await hook.async_post_call_success_hook(third, auth, {"usage": {"total_tokens": 10}})
        # Three requests this month (the denial counted none): the fourth is refused.
        over = await refused(hook, auth, request(max_tokens=1))
        assert over.headers["rate_limit_type"] == "requests"
        assert over.headers["x-ratelimit-key-remaining-requests-month"] == "0"
        with db_redis.client() as admin:
            used = {k.decode().rsplit(":", 1)[0]: admin.hget(k, "used") for k in admin.keys("llm:key:*")}
        assert used == {"llm:key:tokens:day": b"50", "llm:key:requests:month+60": b"3"}

    run(body())


def test_max_delay_holds_a_request_for_its_turn_and_a_cancel_gives_it_back(db_redis: Server):
    async def body() -> None:
        # A burst of 30, then one every 2 s; a lease beside, so the leases go first.
        hook = hook_on(db_redis, max_delay=2.0, tiers={"default": {"key": {"rpm": 30, "parallel": 100}}})
        slept: list[float] = []

        async def sleep(seconds: float) -> None:
            slept.append(seconds)

        async def cancelled(seconds: float) -> None:
            raise asyncio.CancelledError

        hook.limiter.sleep = sleep
        auth = UserAPIKeyAuth(api_key="sk-paced")
        for i in range(30):
            await admit(hook, auth, request(litellm_call_id=f"burst-{i}"))
        assert slept == []
        await admit(hook, auth, request(litellm_call_id="paced"))  # its turn within 2 s
        assert len(slept) == 1 and 0 < slept[0] <= 2.0
        denied = await refused(hook, auth, request(litellm_call_id="too-late"))  # the turn after: over
        assert denied.status_code == 429 and int(denied.headers["retry-after"]) >= 2
        assert "too-late" not in hook.open
        for i in range(30):
            await hook.async_post_call_success_hook(request(litellm_call_id=f"burst-{i}"), auth, {})
        await asyncio.sleep(2)  # the paced one's turn passes
        # A caller that leaves while it waits gives its turn and its slot back.
        hook.limiter.sleep = cancelled
        with pytest.raises(asyncio.CancelledError):
            await admit(hook, auth, request(litellm_call_id="gone"))
        assert "gone" not in hook.open
        await asyncio.sleep(0.1)  # the shielded refund and release land
        hook.limiter.sleep = sleep
        await admit(hook, auth, request(litellm_call_id="next"))  # one turn away, not two
        assert 0 < slept[-1] <= 2.0
        with db_redis.client() as admin:
            (lease_key,) = admin.keys("llm:key:parallel:*")
        assert await hook.limiter.in_flight(lease_key) == 2  # paced and next
        for call in ("paced", "next"):
            await hook.async_post_call_success_hook(request(litellm_call_id=call), auth, {})

    run(body())


def test_a_release_goes_out_while_the_breaker_is_open(tmp_path: Path):
    server = Server("redis-7.0", tmp_path / "redis", module=True).start()

    async def body() -> None:
        spec = parse({"redis_url": server.url, "tiers": {"default": {"key": {"parallel": 2}}}}, "test")
        lim = AsyncLimiter(redis.asyncio.Redis(port=server.port), on_error="open", timeout=0.2)
        hook = TokenBucketHook(spec, lim)
        auth = UserAPIKeyAuth(api_key="sk-breaker")
        held = await admit(hook, auth, request(litellm_call_id="held"))
        with server.client() as admin:
            (key,) = admin.keys("llm:key:parallel:*")
        assert await lim.in_flight(key) == 1
        server.pause()  # hung: each call times out, and five open the breaker
        for i in range(5):
            await admit(hook, auth, request(litellm_call_id=f"during-{i}"))  # open: admitted, degraded
        assert lim.breaker_state == "open"
        server.resume()
        # Within the breaker's cooldown: decisions skip Redis, a release still goes.
        await hook.async_post_call_success_hook(held, auth, {})
        assert lim.breaker_state == "open"
        with server.client() as admin:  # the limiter's own reads wait for the breaker
            assert admin.execute_command("TB.INFLIGHT", key) == 0

    try:
        run(body())
    finally:
        server.resume()
        server.stop()


def test_on_a_cluster_a_later_denial_refunds_the_earlier_and_holds_no_slot(tmp_path: Path):
    cluster = Cluster("redis-7.0", tmp_path / "cluster", module=True).start()

    async def body() -> None:
        tiers = {"default": {"key": {"rpm": 5, "parallel": 2}, "team": {"rpm": 1}}}
        spec = parse({"on_error": "closed", "tiers": tiers}, "test")
        client = redis.asyncio.RedisCluster(host="127.0.0.1", port=cluster.port)
        hook = TokenBucketHook(spec, AsyncLimiter(client))
        auth = UserAPIKeyAuth(api_key="sk-cluster", team_id="team-c")
        first = await admit(hook, auth, request(litellm_call_id="c1"))
        # The key's slot and bucket are in other slots than the team's bucket: taken
        # one by one, then given back when the team's bucket (spent) refuses.
        denied = await refused(hook, auth, request(litellm_call_id="c2"))
        assert denied.status_code == 429 and "team" in str(denied.detail)
        keys = [k.decode() async for k in client.scan_iter("llm:key:*")]
        (bucket,) = [k for k in keys if ":requests:" in k]
        (slots,) = [k for k in keys if ":parallel:" in k]
        lim = hook.limiter
        assert (await lim.peek(bucket, Bucket(5, 5 / 60), 0)).remaining == 4  # c1's only
        assert await lim.in_flight(slots) == 1  # c1's only
        await hook.async_post_call_success_hook(first, auth, {})
        assert await lim.in_flight(slots) == 0
        await client.aclose()

    try:
        run(body())
    finally:
        cluster.stop()


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"tierz": {}}, "test: unknown field 'tierz'"),
        ({"on_error": "maybe"}, "test: on_error must be one of open, closed, local, got 'maybe'"),
        ({"tiers": {"default": {"org": {"rpm": 1}}}}, "test: tiers.default: unknown dimension 'org'"),
        ({"tiers": {"default": {"key": {"rpd": 1}}}}, "test: tiers.default.key: unknown limit 'rpd'"),
        ({"tiers": {"default": {"key": {"parallel": 2_000_000}}}}, "test: tiers.default.key: limit must be"),
        ({"models": {"gpt": {"tpm": 1.5}}}, "test: models.gpt: tpm must be a whole number >= 1, got 1.5"),
        ({"lease_ms": 0}, "test: lease_ms must be a whole number >= 1, got 0"),
        (
            {"tiers": {"default": {"key": {"budgets": [{"tokens": 5, "per": "fortnight"}]}}}},
            "test: tiers.default.key.budgets[0]: period must be",
        ),
        (
            {"models": {"gpt": {"budgets": [{"tokens": 5, "requests": 1, "per": "day"}]}}},
            "test: models.gpt.budgets[0]: give one of requests or tokens",
        ),
        (
            {"models": {"gpt": {"budgets": [{"tokens": 5, "per": "day", "offset": 1440}]}}},
            "test: models.gpt.budgets[0]: offset must be",
        ),
        (
            {"models": {"gpt": {"budgets": [{"tokens": 5, "per": "day"}, {"tokens": 9, "per": "DAY"}]}}},
            "test: models.gpt.budgets[1]: a second tokens budget per day",
        ),
        ({"models": {"gpt": {"budgets": {"tokens": 5}}}}, "test: models.gpt.budgets: must be a list of budgets"),
    ],
)
def test_malformed_rules_are_refused_naming_the_field(spec: dict[str, Any], message: str):
    with pytest.raises(RulesError) as bad:
        parse(spec, "test")
    assert str(bad.value).startswith(message), bad.value


def test_a_rules_file_that_cant_be_read_is_named(tmp_path: Path):
    with pytest.raises(RulesError, match=r"rules\.yaml: can.t read the rules file"):
        load(str(tmp_path / "rules.yaml"))
    (tmp_path / "bad.yaml").write_text("tiers: [unclosed")
    with pytest.raises(RulesError, match=r"bad\.yaml: not YAML"):
        load(str(tmp_path / "bad.yaml"))


def test_the_examples_rules_load_with_their_budgets():
    rules = load(str(Path(__file__).resolve().parents[3] / "examples" / "litellm" / "rules.yaml"))
    team = rules.tiers["pro"]["team"]
    assert [(b.kind, b.amount, b.per, b.offset) for b in team.budgets] == [
        ("tokens", 100_000_000, "month", 0),
        ("requests", 50_000, "day", -300),
    ]
    assert rules.tiers["default"]["key"].budgets[0].per == "month"
