"""POST /v1/chat: reserve prompt + max_tokens, call the model, settle."""

from __future__ import annotations

import pytest

from conftest import LIMITS, auth
from llm import Completion, LLMError, StubLLM, count_tokens

BUDGET = LIMITS.tiers["free"].llm  # 100 tokens, refill negligible
LLM_KEY = "rl:llm:user:u-free"
USER_KEY = "rl:user:u-free"


class SpyLLM(StubLLM):
    """The stub, recording the budget while the model "runs", and
    optionally failing or overrunning the estimate."""

    def __init__(self, balance, fail: bool = False, extra_prompt_tokens: int = 0) -> None:
        self.balance, self.fail, self.extra = balance, fail, extra_prompt_tokens
        self.seen: list[int] = []

    async def complete(self, prompt: str, max_tokens: int) -> Completion:
        self.seen.append(self.balance())
        if self.fail:
            raise LLMError("model backend exploded")
        done = await super().complete(prompt, max_tokens)
        # A tokenizer that counts more than the gateway estimated.
        return done.model_copy(update={"prompt_tokens": done.prompt_tokens + self.extra})


@pytest.fixture
def balance(server, r):
    return lambda: server.peek(r, LLM_KEY, BUDGET)[1]


def chat(client, prompt: str = "a b c d", max_tokens: int = 10, key: str = "k-free"):
    return client.post("/v1/chat", headers=auth(key), json={"prompt": prompt, "max_tokens": max_tokens})


def test_reserve_then_settle_refunds_the_unused_part(make_client, balance, cluster_mode):
    spy = SpyLLM(balance)
    client = make_client(llm=spy, cluster_mode=cluster_mode)
    res = chat(client)  # 4 prompt + 10 max reserved, 4 + 4 used
    assert res.status_code == 200
    assert res.json()["usage"] == {"prompt_tokens": 4, "completion_tokens": 4, "reserved_tokens": 14}
    assert spy.seen == [100 - 14]
    assert balance() == 100 - 8
    # The headers report the budget after the refund.
    assert '"llm";q=100;w=100000' in res.headers["RateLimit-Policy"]
    assert '"llm";r=92;' in res.headers["RateLimit"]


def test_backend_failure_refunds_everything(make_client, balance, server, r, cluster_mode):
    spy = SpyLLM(balance, fail=True)
    client = make_client(llm=spy, cluster_mode=cluster_mode)
    res = chat(client)
    assert res.status_code == 502 and res.json() == {"error": "upstream_failed"}
    assert spy.seen == [86]
    assert balance() == 100
    assert r.exists(LLM_KEY) == 0  # back to full, which is no key at all
    # The request itself still counted: a failing upstream must not invite
    # retry loops for free.
    assert server.peek(r, USER_KEY, LIMITS.tiers["free"].user)[1] == 2


def test_overrun_is_charged_as_debt(make_client, balance):
    client = make_client(llm=SpyLLM(balance, extra_prompt_tokens=90))
    assert chat(client).status_code == 200  # reserved 14, used 94 + 4 = 98
    assert balance() == 2
    assert chat(client, "a", 1).status_code == 200  # reserved 2, used 92: into debt
    assert balance() == 2 - 2 - 90
    res = chat(client, "a", 1)
    assert res.status_code == 429 and res.json()["dimension"] == "llm"
    assert '"llm";r=0;' in res.headers["RateLimit"]  # debt shows as 0 left


def test_budget_denial_charges_nothing_else(make_client, balance, server, r, cluster_mode):
    client = make_client(llm=SpyLLM(balance), cluster_mode=cluster_mode)
    assert chat(client, max_tokens=90).status_code == 200  # 94 reserved, 8 used
    assert balance() == 92
    res = chat(client, max_tokens=95)  # 99 > 92
    assert res.status_code == 429
    assert res.json()["dimension"] == "llm"
    assert int(res.headers["Retry-After"]) == (99 - 92) * 1000  # rate 0.001/s
    assert balance() == 92
    assert server.peek(r, USER_KEY, LIMITS.tiers["free"].user)[1] == 2  # only the first request


def test_more_than_the_whole_budget_is_refused_up_front(make_client, r):
    res = chat(make_client(), max_tokens=BUDGET.max)  # 4 + 100 > 100
    assert res.status_code == 413 and res.json()["error"] == "over_budget"
    assert r.keys("*") == []


def test_unauthenticated_chat(make_client, r):
    res = make_client().post("/v1/chat", json={"prompt": "hi", "max_tokens": 1})
    assert res.status_code == 401
    assert r.keys("rl:llm:*") == []


def test_token_count():
    assert count_tokens("  a b\tc\n") == 3
