"""Every backend, sync and asyncio, answers a scenario as the module does,
and the module's answers on fresh keys are the hand-worked ones.

Replies carry times that shrink as the clock runs (retry and reset are
counted from now), so those are compared within the time the runs took;
everything else (allowed, remaining) must be equal. The refill rates are
slow enough that no balance moves by a whole token during a run.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Union

import pytest
from conftest import SLOW, Target, run

import redis_tokenbucket.asyncio as tb_asyncio
from redis_tokenbucket import Bucket, Decision, Limiter, MultiDecision

A = Bucket(5, SLOW)
B = Bucket(2.5, 0.002)
LLM = Bucket(100_000, 0.5)
D = Bucket(0.5, SLOW)
F = Bucket(1, SLOW)

# (operation, arguments): keys get a per-run prefix.
SCENARIO: list[tuple[str, tuple[Any, ...]]] = [
    ("consume", ("a", A, 1)),
    ("consume", ("a", A, 3)),
    ("consume", ("a", A, 2)),  # denied: 1 left
    ("peek", ("a", A, 1)),
    ("adjust", ("a", A, 2)),  # refund
    ("adjust", ("a", A, -7)),  # into debt
    ("consume", ("a", A, 1)),  # denied while in debt
    ("consume", ("b", B, 2.5)),
    ("consume", ("b", B, 0)),  # cost 0 passes an empty bucket
    ("consume_many", ([("c", LLM, 350), ("d", D, 0.5)],)),
    ("consume_many", ([("c", LLM, 350), ("b", B, 1)],)),  # b denies: c is not charged
    ("peek", ("e", A, 5)),
    ("consume", ("f", F, 0.3)),
    ("consume", ("f", F, 0.7)),
    ("adjust", ("f", F, 5)),  # capped at max: full, the key is deleted
    ("peek", ("f", F, 1)),
]

# The module's answers worked out by hand: retry and reset are
# 1000 * tokens / rate ms, less the time elapsed since the write.
EXPECTED: dict[int, Any] = {
    0: (True, 4, 0, 1_000_000),
    1: (True, 1, 0, 4_000_000),
    2: (False, 1, 1_000_000, 4_000_000),
    3: (True, 1, 0, 4_000_000),
    4: (True, 3, 0, 2_000_000),
    # In debt: a request of cost 1 would be denied for 5,000 s.
    5: (False, -4, 5_000_000, 9_000_000),
    6: (False, -4, 5_000_000, 9_000_000),
    7: (True, 0, 0, 1_250_000),
    8: (True, 0, 0, 1_250_000),
    9: (True, 0, ((True, 99_650, 0, 700_000), (True, 0, 0, 500_000))),
    10: (False, 500_000, ((True, 99_650, 0, 700_000), (False, 0, 500_000, 1_250_000))),
    11: (True, 5, 0, 0),
    13: (True, 0, 0, 1_000_000),
    14: (True, 1, 0, 0),
    15: (True, 1, 0, 0),
}

Reply = tuple[Any, ...]


def normal(result: Union[Decision, MultiDecision]) -> Reply:
    if isinstance(result, MultiDecision):
        return (result.allowed, result.retry_after_ms, tuple(normal(d) for d in result.decisions))
    return (result.allowed, result.remaining, result.retry_after_ms, result.reset_after_ms)


def steps(prefix: str) -> list[tuple[str, tuple[Any, ...]]]:
    def keyed(args: tuple[Any, ...]) -> tuple[Any, ...]:
        if isinstance(args[0], list):
            return ([(prefix + k, *rest) for k, *rest in args[0]],)
        return (prefix + args[0], *args[1:])

    return [(op, keyed(args)) for op, args in SCENARIO]


def run_sync(lim: Limiter, prefix: str) -> tuple[list[Reply], float]:
    start = time.monotonic()
    out = [normal(getattr(lim, op)(*args)) for op, args in steps(prefix)]
    return out, (time.monotonic() - start) * 1000


def run_async(target: Target, prefix: str, **options: Any) -> tuple[list[Reply], float]:
    async def main() -> tuple[list[Reply], float]:
        client = target.async_client()
        try:
            lim = tb_asyncio.Limiter(client, **options)
            start = time.monotonic()
            out = [normal(await getattr(lim, op)(*args)) for op, args in steps(prefix)]
            return out, (time.monotonic() - start) * 1000
        finally:
            await client.aclose()

    return run(main())


def assert_same(a: Sequence[Any], b: Sequence[Any], slack: float, where: str = "") -> None:
    """Equal, but for times (retry, reset), which may differ by `slack` ms."""
    if len(a) == 3 and isinstance(a[2], tuple):  # a MultiDecision
        assert a[0] == b[0], where
        assert abs(a[1] - b[1]) <= slack, where
        assert len(a[2]) == len(b[2]), where
        for x, y in zip(a[2], b[2], strict=True):
            assert_same(x, y, slack, where)
        return
    assert a[:2] == b[:2], where
    assert abs(a[2] - b[2]) <= slack and abs(a[3] - b[3]) <= slack, f"{where}: {a} vs {b}"


def test_the_module_gives_the_hand_worked_answers(module_target: Target):
    replies, took = run_sync(Limiter(module_target.client()), "hand:")
    for i, expected in EXPECTED.items():
        assert_same(replies[i], expected, took + 1, f"step {i}")
    # On a fresh key nothing has elapsed yet: exact.
    assert replies[0] == EXPECTED[0] and replies[7] == EXPECTED[7] and replies[11] == EXPECTED[11]


@pytest.mark.parametrize("mode", ["sync", "asyncio"])
def test_every_backend_answers_like_the_module(module_target: Target, target: Target, mode: str):
    reference, ref_took = run_sync(Limiter(module_target.client()), "ref:")
    if mode == "sync":
        lim = Limiter(target.client())
        replies, took = run_sync(lim, "t:")
        assert lim.backend == target.backend
    else:
        replies, took = run_async(target, "t:")
    for i, (a, b) in enumerate(zip(reference, replies, strict=True)):
        assert_same(a, b, ref_took + took + 1, f"step {i} {SCENARIO[i][0]}")


def test_the_three_backends_on_the_same_keys(module_target: Target):
    """One server, the same key names, each backend forced in turn: the
    module's Lua fallback is a drop-in on the same data."""
    runs = {}
    for backend in ("module", "functions", "eval"):
        with module_target.admin() as admin:
            admin.flushall()
        runs[backend] = run_sync(Limiter(module_target.client(), backend=backend), "same:")  # type: ignore[arg-type]
    (ref, ref_took) = runs.pop("module")
    for backend, (replies, took) in runs.items():
        for i, (a, b) in enumerate(zip(ref, replies, strict=True)):
            assert_same(a, b, ref_took + took + 1, f"{backend} step {i}")
