"""The Python runner of clients/spec: every scenario of the behaviour the
clients share (clients/spec/README.md), without a server: a fake clock,
and fake redis-py clients (blocking and asyncio) that answer each command
with the scenario's scripted reply. Limiter scenarios run through the
blocking Limiter and the asyncio one; those that start calls without
awaiting them (`start`, `burst`) need tasks, so run through asyncio only.
It runs from the installed wheel (`make test-python`) and, in `make
check`, from the package source with its Lua files beside it."""

from __future__ import annotations

import asyncio
import json
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Optional

import pytest
import redis
import redis.exceptions
from redis.connection import DefaultParser

import redis_tokenbucket.asyncio as tb_asyncio
from redis_tokenbucket import (
    Breaker,
    Bucket,
    CircuitOpenError,
    Concurrency,
    Decision,
    DenialCache,
    InvalidArgument,
    Limiter,
    Quota,
)
from redis_tokenbucket._breaker import CALL, PROBE, SKIP
from redis_tokenbucket._classify import classify
from redis_tokenbucket._errors import NoBackendError, Shed
from redis_tokenbucket._scripts import library_version

SPEC = (
    Path(os.environ["TB_REPO"]) / "clients" / "spec"
    if "TB_REPO" in os.environ
    else Path(__file__).resolve().parents[2] / "spec"
)
START_MS = 1_000_000
CLIENT = "python"
REDIS_MAJOR = int(redis.__version__.split(".")[0])


def _scenarios() -> list[tuple[str, dict[str, Any]]]:
    found = []
    for path in sorted(SPEC.glob("*.json")):
        for s in json.loads(path.read_text(encoding="utf-8"))["scenarios"]:
            found.append((path.stem, s))
    return found


SCENARIOS = _scenarios()


def _applies(s: dict[str, Any]) -> bool:
    return "clients" not in s or CLIENT in s["clients"]


def _concurrent(s: dict[str, Any]) -> bool:
    return any("start" in step or "burst" in step for step in s.get("steps", ()))


def _params() -> Iterator[Any]:
    for file, s in SCENARIOS:
        title = f"{file}: {s['name']}"
        subject = s["subject"]
        if subject not in ("classify", "breaker", "cache", "limiter", "limit_strings"):
            raise AssertionError(f"{title}: unknown subject {subject!r}")
        skip = () if _applies(s) else (pytest.mark.skip(reason=f"for {', '.join(s['clients'])} only"),)
        if subject != "limiter":
            yield pytest.param(s, None, id=title, marks=skip)
            continue
        for flavour in ("sync", "asyncio"):
            if flavour == "sync" and _concurrent(s):
                continue  # calls left running need tasks
            yield pytest.param(s, flavour, id=f"{title} [{flavour}]", marks=skip)


@pytest.mark.parametrize(("scenario", "flavour"), list(_params()))
def test_scenario(scenario: dict[str, Any], flavour: Optional[str]) -> None:
    subject = scenario["subject"]
    if subject == "classify":
        run_classify(scenario)
    elif subject == "breaker":
        run_breaker(scenario)
    elif subject == "cache":
        run_cache(scenario)
    elif subject == "limit_strings":
        run_limit_strings(scenario)
    elif flavour == "sync":
        run_sync_limiter(scenario)
    else:
        asyncio.run(run_async_limiter(scenario))


def test_the_spec_has_scenarios_in_every_area() -> None:
    subjects = {s["subject"] for _, s in SCENARIOS}
    assert subjects >= {"classify", "breaker", "cache", "limiter", "limit_strings"}
    assert sum(1 for _, s in SCENARIOS if _applies(s)) > 50


class Clock:
    """The fake clock: integer milliseconds, read in seconds as the
    package's clocks are (so a boundary falls on an exact float)."""

    def __init__(self) -> None:
        self.ms = START_MS

    def __call__(self) -> float:
        return self.ms / 1000


# ---- errors, as redis-py and the package make them ---------------------------------


def reply_error(text: str) -> Exception:
    """An error reply, as redis-py's parser makes it (LOADING is a
    BusyLoadingError, "ERR max number of clients reached" a ConnectionError)."""
    error = DefaultParser(socket_read_size=65536).parse_error(text)
    assert isinstance(error, Exception)
    return error


def system_error(e: dict[str, Any]) -> OSError:
    return OSError(e["number"], e["message"])


def wrapped_system_error(e: dict[str, Any]) -> Exception:
    """A system error as redis-py's connection raises it: its words for the
    syscall, with the OSError as its context."""
    if e["syscall"] == "connect":
        text = f"Error {e['number']} connecting to 127.0.0.1:6379. {e['message']}."
    elif e["syscall"] == "write":
        text = f"Error {e['number']} while writing to socket. {e['message']}."
    else:
        text = f"Error while reading from 127.0.0.1:6379 : ({e['number']}, '{e['message']}')"
    error = redis.exceptions.ConnectionError(text)
    error.__context__ = system_error(e)
    return error


def timeout_after_write() -> Exception:
    return redis.exceptions.TimeoutError("Timeout reading from socket")


def errors_of(e: dict[str, Any]) -> list[BaseException]:
    """The errors `e` stands for in Python: [] for another client's forms."""
    if "reply" in e:
        return [reply_error(e["reply"])]
    if "errno" in e:
        return [system_error(e), wrapped_system_error(e)]
    if e.get("timeout") == "after_write":
        return [timeout_after_write()]
    if "package" in e:
        made: dict[str, Callable[[], BaseException]] = {
            "circuit_open": lambda: CircuitOpenError("Redis failed 5 times lately"),
            "shed": lambda: Shed("the event loop fell 0.080 s behind the call"),
            "no_backend": lambda: NoBackendError([("module", redis.exceptions.ResponseError("unknown command"))]),
            "wrong_shape": lambda: ValueError("not enough values to unpack (expected 4, got 2)"),
        }
        return [made[e["package"]]()]
    if e.get("library") == "redis-py":
        if e.get("since", 0) > REDIS_MAJOR:  # the class is newer than this redis-py
            return []
        cls = getattr(redis.exceptions, e["class"])
        error = cls(e["message"])
        if "cause" in e:
            error.__cause__ = errors_of(e["cause"])[0]
        return [error]
    if "library" in e:
        return []  # another client's library
    raise AssertionError(f"the python runner can't make {e}")


def run_classify(s: dict[str, Any]) -> None:
    ran = 0
    for case in s["cases"]:
        if CLIENT not in case.get("clients", [CLIENT]):
            continue
        for error in errors_of(case["error"]):
            ran += 1
            assert classify(error) == case["kind"], f"{case['error']} as {type(error).__name__}: {error}"
    assert ran > 0 or all("library" in c["error"] for c in s["cases"]), "no case ran"


# ---- limit strings -------------------------------------------------------------------

LIMIT_CASE_FIELDS = {"parse", "parse_many", "bucket", "buckets", "error", "why", "clients"}


def run_limit_strings(s: dict[str, Any]) -> None:
    ran = 0
    for case in s["cases"]:
        unknown = set(case) - LIMIT_CASE_FIELDS
        assert not unknown, f"the python runner can't read {sorted(unknown)} in {case}"
        if CLIENT not in case.get("clients", [CLIENT]):
            continue
        ran += 1
        many = "parse_many" in case
        text = case["parse_many"] if many else case["parse"]
        if "error" in case:
            with pytest.raises(InvalidArgument) as raised:
                Bucket.parse_many(text) if many else Bucket.parse(text)
            got = {"field": raised.value.field, "message": str(raised.value)}
            assert got == case["error"], repr(text)
            continue
        buckets = Bucket.parse_many(text) if many else [Bucket.parse(text)]
        want = case["buckets"] if many else [case["bucket"]]
        # Exact doubles: every client computes N / (k * unit seconds) alike.
        assert [{"max": b.max, "rate": b.rate} for b in buckets] == want, repr(text)
    assert ran > 0, "no case ran"


# ---- the breaker ---------------------------------------------------------------------

ENTER = {"call": CALL, "probe": PROBE, "skip": SKIP}


def run_breaker(s: dict[str, Any]) -> None:
    clock = Clock()
    b = s["breaker"]
    breaker = Breaker(b["failures"], b["window_ms"] / 1000, b["cooldown_ms"] / 1000, clock=clock)
    for i, step in enumerate(s["steps"], 1):
        where = f"step {i}"
        if "advance_ms" in step:
            clock.ms += step["advance_ms"]
        elif "state" in step:
            assert breaker.state == step["state"], where
        elif "enter" in step:
            assert breaker.enter() == ENTER[step["enter"]], f"{where}: enter"
        elif "report" in step:
            report = {"success": breaker.success, "failure": breaker.failure, "release": breaker.release}
            report[step["report"]](step.get("probe", False))
        else:
            raise AssertionError(f"{where}: unknown step {step}")


# ---- the denial cache ----------------------------------------------------------------


def bucket_of(b: dict[str, Any]) -> Bucket:
    unknown = set(b) - {"max", "rate", "name"}
    assert not unknown, f"the runner knows no bucket field {unknown}"
    return Bucket(b["max"], b["rate"], b.get("name"))


def decision_of(d: dict[str, Any], key: str) -> Decision:
    return Decision(
        d["allowed"], d["remaining"], d["retry_after_ms"], d["reset_after_ms"], key, bucket_of(d["bucket"]), d["cost"]
    )


def run_cache(s: dict[str, Any]) -> None:
    clock = Clock()
    cache = DenialCache(s["entries"], clock)
    tickets: dict[str, Any] = {}
    for i, step in enumerate(s["steps"], 1):
        where = f"step {i}"
        if "advance_ms" in step:
            clock.ms += step["advance_ms"]
        elif "sent" in step:
            tickets[step["as"]] = (cache.sent(step["sent"], step["keys"]), step["keys"])
        elif "answered" in step:
            ticket, keys = tickets[step["answered"]]
            decisions = [decision_of(d, k) for d, k in zip(step["decisions"], keys, strict=False)]  # a reset has none
            cache.answered(ticket, step["allowed"], step["retry_after_ms"], decisions)
        elif "failed" in step:
            cache.failed(tickets[step["failed"]][0])
        elif "size" in step:
            assert len(cache) == step["size"], f"{where}: size"
        elif "lookup" in step:
            lookup = step["lookup"]
            hit = cache.lookup(lookup["keys"], [bucket_of(b) for b in lookup["buckets"]], lookup["costs"])
            if step["expect"] is None:
                assert hit is None, f"{where}: a miss, got {hit}"
            else:
                assert hit is not None, f"{where}: a hit"
                expect_fields(hit, step["expect"], where)
        else:
            raise AssertionError(f"{where}: unknown step {step}")


# ---- answers compared ----------------------------------------------------------------

FIELDS = {
    "allowed",
    "remaining",
    "retry_after_ms",
    "reset_after_ms",
    "degraded",
    "shed",
    "cached",
    "acquired",
    "in_use",
    "expires_in_ms",
    "held",
    "lost",
    "delay_ms",
    "shadow",
    "rule",
}


def expect_fields(got: Any, want: dict[str, Any], where: str) -> None:
    for name, value in want.items():
        if name == "decisions":
            assert len(got.decisions) >= len(value), f"{where}: decisions"
            for j, d in enumerate(value, 1):
                expect_fields(got.decisions[j - 1], d, f"{where}: decision {j}")
            continue
        assert name in FIELDS, f"{where}: the runner knows no field {name}"
        assert getattr(got, name) == value, f"{where}: {name} is {getattr(got, name)!r}, expected {value!r}"


# ---- limiter scenarios: a fake Redis that answers from the script --------------------


def words_of(args: tuple[Any, ...]) -> list[str]:
    words: list[str] = []
    for i, a in enumerate(args):
        text = a.decode("latin-1") if isinstance(a, (bytes, bytearray, memoryview)) else str(a)
        # redis-py takes a command of two words as one argument ("FUNCTION LOAD").
        words += text.split(" ") if i == 0 else [text]
    return words


def command_text(args: tuple[Any, ...]) -> str:
    """A command as the spec names it (README.md): its name and the words
    that tell it apart."""
    w = words_of(args)
    name = w[0].upper()
    if name in ("TB.CONSUME", "TB.PEEK", "TB.ADJUST", "TB.INFLIGHT"):
        return " ".join([name, w[1], *w[5:]])  # and WAIT ms
    if name in ("TB.QUOTA", "TB.QPEEK", "TB.QADJUST"):
        return " ".join([name, w[1], w[3], *w[5:]])  # the period, and OFFSET m
    if name == "TB.MCONSUME":
        return " ".join([name, *w[1::4]])
    if name == "TB.CHARGE":
        n = int(w[1])
        wait = w[2 + n : 4 + n] if w[2 + n : 3 + n] == ["WAIT"] else []
        return " ".join([name, *w[2 : 2 + n], *wait])
    if name == "TB.ACQUIRE":
        return f"{name} {w[1]} {w[4]}"
    if name in ("TB.RELEASE", "TB.RENEW"):
        return f"{name} {w[1]} {w[2]}"
    if name in ("FCALL", "FCALL_RO"):
        return (
            " ".join([name, w[1], w[3], *single(w[1].removeprefix("tb_"), w[4:])])
            if int(w[2]) > 0
            else f"{name} {w[1]}"
        )
    if name in ("EVALSHA", "EVAL"):
        n = int(w[2])
        return " ".join([name, w[3 + n], w[3], *(single(w[3 + n], w[4 + n :]) if n == 1 else [])])
    if name == "FUNCTION":
        return f"FUNCTION {w[1].upper()}"
    return " ".join([name, *w[1:]])


def single(op: str, argv: list[str]) -> list[str]:
    """The words after the key that tell a one-key call apart: a
    reservation's WAIT ms, a quota's period and OFFSET m."""
    if op in ("consume", "peek", "adjust"):
        return argv[3:]
    if op in ("quota", "qpeek", "qadjust"):
        return [argv[1], *argv[3:]]
    return []


def matches(expected: str, text: str, bound: dict[str, str], bind: bool) -> bool:
    """Whether an expected command (words, `$name` capturing a word) names
    `text`; its captures go into `bound` when `bind`."""
    want, got = expected.split(" "), text.split(" ")
    if len(want) > len(got):
        return False
    new: dict[str, str] = {}
    for word, have in zip(want, got, strict=False):  # `want` may be shorter
        if word.startswith("$"):
            known = bound.get(word, new.get(word))
            if known is None:
                new[word] = have
            elif known != have:
                return False
        elif word != have:
            return False
    if bind:
        bound.update(new)
    return True


def reply_of(reply: Any) -> Any:
    """A scripted reply as redis-py's parser gives it (bulk strings as bytes)."""
    if reply == "$LIBRARY_VERSION":
        return library_version().encode()
    if isinstance(reply, str):
        return reply.encode()
    if isinstance(reply, list):
        return [reply_of(r) for r in reply]
    return reply


REPLY_FORMS = {"command", "reply", "error", "fail", "hold", "repeat"}


class Entry:
    def __init__(self, e: dict[str, Any]) -> None:
        unknown = set(e) - REPLY_FORMS
        assert not unknown, f"the runner knows no reply field {unknown}"
        self.e = e
        self.command: str = e["command"]
        self.repeat: bool = e.get("repeat", False)
        self.hold: bool = e.get("hold", False)
        self.used = 0


class Active:
    """A step whose scripted replies are in play."""

    def __init__(self, step: dict[str, Any], burst: bool) -> None:
        self.entries = [Entry(e) for e in step.get("redis", [])]
        self.burst = burst
        self.held: list[asyncio.Future[None]] = []


class Script:
    """The scripted Redis: takes each command the limiter sends, answers it
    from the active steps' replies, and records it."""

    def __init__(self) -> None:
        self.vars: dict[str, str] = {}
        self.active: list[Active] = []
        self.unexpected: list[str] = []
        self.sent: list[str] = []

    def take(self, text: str) -> Optional[tuple[Entry, Active]]:
        for step in self.active:
            if step.burst:
                candidates = [e for e in step.entries if e.repeat or e.used == 0]
            else:
                first = next((e for e in step.entries if not e.repeat and e.used == 0), None)
                candidates = [*([first] if first else []), *(e for e in step.entries if e.repeat)]
            for e in candidates:
                if matches(e.command, text, self.vars, False):
                    matches(e.command, text, self.vars, True)
                    e.used += 1
                    return e, step
        return None

    def find(self, args: tuple[Any, ...]) -> tuple[Entry, Active]:
        text = command_text(args)
        self.sent.append(text)
        found = self.take(text)
        if found is None:
            self.unexpected.append(text)
            raise AssertionError(f"the scenario expects no {text}")
        return found

    def answer(self, entry: Entry) -> Any:
        e = entry.e
        if "reply" in e:
            return reply_of(e["reply"])
        if "error" in e:
            raise reply_error(e["error"])
        fail = e["fail"]
        if fail.get("timeout") == "after_write":
            # As the transport raises it when the budget runs out.
            raise timeout_after_write()
        if "errno" in fail:
            raise wrapped_system_error(fail)
        raise AssertionError(f"the python runner can't make the failure {fail}")

    def begin(self, step: dict[str, Any], burst: bool = False) -> Active:
        active = Active(step, burst)
        self.active.insert(0, active)
        return active

    def end(self, active: Active, where: str) -> None:
        self.active.remove(active)
        left = [e.command for e in active.entries if not e.repeat and e.used == 0]
        assert left == [], f"{where}: scripted commands never sent"
        assert self.unexpected == [], f"{where}: commands the scenario does not expect"


class FakeRedis:
    """A blocking redis-py client, as far as the limiter drives one."""

    def __init__(self, script: Script) -> None:
        self.script = script

    def execute_command(self, *args: Any, **options: Any) -> Any:
        entry, _ = self.script.find(args)
        assert not entry.hold, "a held reply needs the asyncio limiter"
        return self.script.answer(entry)

    def pipeline(self, transaction: bool = True) -> FakePipeline:
        assert not transaction, "the limiter pipelines without MULTI"
        return FakePipeline(self)


class FakePipeline:
    """redis-py's pipeline: commands queued, then sent in order; error
    replies in place with raise_on_error=False, a connection's failure raised."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.queued: list[tuple[Any, ...]] = []

    def execute_command(self, *args: Any, **options: Any) -> FakePipeline:
        self.queued.append(args)
        return self

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        assert not raise_on_error, "the limiter reads every reply"
        replies: list[Any] = []
        for args in self.queued:
            try:
                replies.append(self.client.execute_command(*args))
            except redis.exceptions.ResponseError as exc:
                replies.append(exc)
        return replies


class FakeAsyncRedis:
    """An asyncio redis-py client, as far as the limiter drives one."""

    def __init__(self, script: Script) -> None:
        self.script = script

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        entry, step = self.script.find(args)
        if entry.hold:
            held: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            step.held.append(held)
            await held
        return self.script.answer(entry)

    def pipeline(self, transaction: bool = True) -> FakeAsyncPipeline:
        assert not transaction, "the limiter pipelines without MULTI"
        return FakeAsyncPipeline(self)


class FakeAsyncPipeline(FakePipeline):
    async def execute(self, raise_on_error: bool = True) -> list[Any]:  # type: ignore[override]
        assert not raise_on_error, "the limiter reads every reply"
        replies: list[Any] = []
        for args in self.queued:
            try:
                replies.append(await self.client.execute_command(*args))
            except redis.exceptions.ResponseError as exc:
                replies.append(exc)
        return replies


LIMITER_OPTIONS = {
    "backend", "on_error", "timeout_ms", "denial_cache", "breaker", "wait_replicas", "wait_timeout_ms", "shadow",
    "near_limit_ratio",
}  # fmt: skip


def limiter_options(s: dict[str, Any], clock: Clock) -> dict[str, Any]:
    o = s.get("limiter", {})
    unknown = set(o) - LIMITER_OPTIONS
    assert not unknown, f"the runner knows no limiter option {unknown}"
    b = o.get("breaker")
    if b is False:
        breaker: Any = False
    elif b is None:
        breaker = Breaker(clock=clock)
    else:
        breaker = Breaker(b["failures"], b["window_ms"] / 1000, b["cooldown_ms"] / 1000, clock=clock)
    entries = o.get("denial_cache")
    # Given only when the scenario sets it: the others hold the default.
    ratio = {"near_limit_ratio": o["near_limit_ratio"]} if "near_limit_ratio" in o else {}
    return ratio | {
        "backend": o.get("backend"),
        "timeout": o.get("timeout_ms", 100) / 1000,
        "on_error": o.get("on_error", "raise"),
        "breaker": breaker,
        "denial_cache": DenialCache(entries, clock) if entries else None,
        "wait_replicas": o.get("wait_replicas", 0),
        "wait_timeout": o.get("wait_timeout_ms", 50) / 1000,
        "shadow": o.get("shadow", False),
    }


CALL_FIELDS = {
    "call", "key", "bucket", "quota", "cost", "delta", "groups", "concurrency", "id", "weight", "buckets", "lease",
    "on_error", "max_wait_ms", "shadow", "block_ms", "redis", "expect", "event", "as",
}  # fmt: skip

EVENT_FIELDS = {"op", "policy", "allowed", "degraded", "shed", "cached", "backend", "outcome", "rule"}


def rule_of(step: dict[str, Any]) -> Any:
    """The step's bucket, or its quota."""
    if "quota" in step:
        q = step["quota"]
        return Quota(q["limit"], q["period"], q.get("offset", 0), q.get("name"))
    return bucket_of(step["bucket"])


def call_of(lim: Any, step: dict[str, Any], leases: dict[str, Any]) -> Callable[[], Any]:
    """The call a step makes, ready to run."""
    unknown = set(step) - CALL_FIELDS
    assert not unknown, f"the runner knows no call field {unknown}"
    op = step["call"]
    options = {"on_error": step["on_error"]} if "on_error" in step else {}

    def group(g: list[Any]) -> tuple[Any, ...]:
        # A bucket, or a quota (it has a period).
        rule = (
            Quota(g[1]["limit"], g[1]["period"], g[1].get("offset", 0), g[1].get("name"))
            if "period" in g[1]
            else bucket_of(g[1])
        )
        return (g[0], rule, *g[2:])

    if "max_wait_ms" in step:
        options["max_wait"] = step["max_wait_ms"] / 1000
    if "shadow" in step:
        assert op in ("consume", "consume_many"), f"shadow is a consume's or a consume_many's, not {op}'s"
        options["shadow"] = step["shadow"]
    if "block_ms" in step:
        assert op == "consume", f"block_ms is a consume's, not {op}'s"
        options["block"] = step["block_ms"] / 1000
    if op in ("consume", "peek", "wait"):
        # The rule is built inside the call: one its client refuses is the call's usage error.
        return lambda: getattr(lim, op)(step["key"], rule_of(step), step.get("cost", 1), **options)
    if op == "adjust":
        return lambda: lim.adjust(step["key"], rule_of(step), step["delta"], **options)
    if op == "consume_many":
        return lambda: lim.consume_many([group(g) for g in step["groups"]], **options)
    if op == "acquire":
        c = step["concurrency"]
        concurrency = Concurrency(c["limit"], c["lease_ms"], c.get("name"))
        buckets = [group(g) for g in step.get("buckets", [])]
        weight = step.get("weight", 1)
        return lambda: lim.acquire(step["key"], concurrency, weight, buckets, id=step.get("id"), **options)
    if op in ("renew", "release"):
        return lambda: getattr(lim, op)(leases[step["lease"]])
    if op == "in_flight":
        return lambda: lim.in_flight(step["key"])
    if op == "reset":
        return lambda: lim.reset(step["key"])
    if op == "detect":
        return lambda: lim.detect()
    raise AssertionError(f"unknown call {op}")


def kind_of(error: BaseException) -> str:
    return "circuit_open" if isinstance(error, CircuitOpenError) else classify(error)


Outcome = tuple[Any, Optional[BaseException]]


class Sleeps:
    """The limiter's sleep, faked: each sleep advances the fake clock, and
    a call's total is its `slept_ms`."""

    def __init__(self, clock: Clock) -> None:
        self.clock, self.ms = clock, 0

    def record(self, seconds: float) -> None:
        ms = round(seconds * 1000)
        self.clock.ms += ms
        self.ms += ms

    async def record_async(self, seconds: float) -> None:
        self.record(seconds)

    def take(self) -> int:
        ms, self.ms = self.ms, 0
        return ms


def judge(outcome: Outcome, step: dict[str, Any], leases: dict[str, Any], where: str, slept_ms: int = 0) -> None:
    """Compares a call's outcome with `expect`; keeps a lease under `as`."""
    value, error = outcome
    want = dict(step.get("expect") or {})
    if "slept_ms" in want:
        assert slept_ms == want.pop("slept_ms"), f"{where}: slept {slept_ms} ms"
    if "raises" in want:
        assert error is not None, f"{where}: expected it to raise ({want['raises']}), got {value!r}"
        assert kind_of(error) == want["raises"], f"{where}: raised {type(error).__name__}: {error}"
        return
    if error is not None:
        raise error
    if "as" in step:
        leases[step["as"]] = value
    if "result" in want:
        assert value == want.pop("result"), f"{where}: result {value!r}"
    expect_fields(value, want, where)


def check_event(events: list[Any], step: dict[str, Any], where: str) -> None:
    """Compares the one event a call reported with the step's `event`."""
    got, events[:] = list(events), []
    if "event" not in step:
        return
    assert len(got) == 1, f"{where}: {len(got)} events, expected one"
    for name, value in step["event"].items():
        assert name in EVENT_FIELDS, f"{where}: the runner knows no event field {name}"
        assert getattr(got[0], name) == value, f"{where}: event {name} is {getattr(got[0], name)!r}, expected {value!r}"


def check_state(lim: Any, check: dict[str, Any], where: str) -> None:
    states: dict[str, Callable[[], Any]] = {
        "breaker": lambda: lim.breaker_state,
        "backend": lambda: lim.backend,
        "leases_held": lambda: lim.leases_held,
        "cache_size": lambda: len(lim.denial_cache),
    }
    for name, value in check.items():
        assert name in states, f"{where}: the runner knows no state {name}"
        assert states[name]() == value, f"{where}: {name} is {states[name]()!r}"


def common_step(lim: Any, clock: Clock, step: dict[str, Any], leases: dict[str, Any], where: str) -> bool:
    """The steps both limiters take alike; False for a call."""
    if "advance_ms" in step:
        clock.ms += step["advance_ms"]
    elif "check" in step:
        check_state(lim, step["check"], where)
    elif "inspect" in step:
        expect_fields(leases[step["inspect"]], step["expect"], where)
    else:
        return False
    return True


def run_sync_limiter(s: dict[str, Any]) -> None:
    clock = Clock()
    script = Script()
    events: list[Any] = []
    lim = Limiter(FakeRedis(script), on_decision=events.append, **limiter_options(s, clock))  # type: ignore[arg-type]
    sleeps = Sleeps(clock)
    lim.sleep = sleeps.record  # type: ignore[method-assign]
    leases: dict[str, Any] = {}
    for i, step in enumerate(s["steps"], 1):
        where = f"step {i}"
        if common_step(lim, clock, step, leases, where):
            continue
        if "call" not in step:
            raise AssertionError(f"{where}: unknown step {step}")
        active = script.begin(step)
        outcome: Outcome
        try:
            outcome = (call_of(lim, step, leases)(), None)
        except Exception as exc:
            outcome = (None, exc)
        script.end(active, where)
        judge(outcome, step, leases, where, sleeps.take())
        check_event(events, step, where)


async def outcome_of(call: Callable[[], Any]) -> Outcome:
    try:
        return await call(), None
    except Exception as exc:
        return None, exc


async def settle(script: Script) -> None:
    """Lets every task run until it is done or waits for a held reply."""
    seen = -1
    while seen != len(script.sent):
        seen = len(script.sent)
        for _ in range(10):
            await asyncio.sleep(0)


def release_held(active: Active) -> None:
    for held in active.held:
        held.set_result(None)
    active.held.clear()


async def run_async_limiter(s: dict[str, Any]) -> None:
    clock = Clock()
    script = Script()
    events: list[Any] = []
    options = limiter_options(s, clock)
    lim = tb_asyncio.Limiter(FakeAsyncRedis(script), on_decision=events.append, **options)  # type: ignore[arg-type]
    sleeps = Sleeps(clock)
    lim.sleep = sleeps.record_async  # type: ignore[method-assign]
    leases: dict[str, Any] = {}
    started: dict[str, tuple[Active, dict[str, Any], asyncio.Task[Outcome]]] = {}
    for i, step in enumerate(s["steps"], 1):
        where = f"step {i}"
        if common_step(lim, clock, step, leases, where):
            continue
        if "call" in step:
            active = script.begin(step)
            outcome = await outcome_of(call_of(lim, step, leases))
            script.end(active, where)
            judge(outcome, step, leases, where, sleeps.take())
            check_event(events, step, where)
        elif "start" in step:
            assert "event" not in step, f"{where}: a started call's event is not compared"
            call = {k: v for k, v in step.items() if k != "start"} | {"call": step["start"]}
            active = script.begin(call)
            task = asyncio.ensure_future(outcome_of(call_of(lim, call, leases)))
            started[step["as"]] = (active, call, task)
            await settle(script)
        elif "resume" in step:
            active, call, task = started.pop(step["resume"])
            release_held(active)
            outcome = await task
            script.end(active, where)
            judge(outcome, {**call, "expect": step.get("expect")}, leases, where)
            events.clear()
        elif "burst" in step:
            active = script.begin(step, burst=True)
            before = len(script.sent)
            tasks = [asyncio.ensure_future(outcome_of(call_of(lim, c, leases))) for c in step["burst"]]
            await settle(script)
            release_held(active)
            outcomes = await asyncio.gather(*tasks)
            assert not any("event" in c for c in step["burst"]), f"{where}: a burst's events are not compared"
            events.clear()
            script.end(active, where)
            for j, (c, o) in enumerate(zip(step["burst"], outcomes, strict=True), 1):
                judge(o, {**c, "expect": step.get("expect_each")}, leases, f"{where}, call {j}")
            sent = script.sent[before:]
            for command, n in step.get("counts", {}).items():
                count = sum(1 for text in sent if matches(command, text, {}, False))
                assert count == n, f"{where}: {command} sent {count} times: {', '.join(sent)}"
        else:
            raise AssertionError(f"{where}: unknown step {step}")
    assert not started, f"calls started and never resumed: {', '.join(started)}"


def test_command_names() -> None:
    """The spec's names of the commands the package sends."""
    assert command_text(("TB.MCONSUME", "a", 1, 1, 1, "b", 2, 1, 1)) == "TB.MCONSUME a b"
    assert command_text(("FUNCTION LOAD", "REPLACE", b"#!lua name=tb\n")) == "FUNCTION LOAD"
    assert command_text(("FCALL_RO", "tb_version", 0)) == "FCALL_RO tb_version"
    assert command_text(("EVALSHA", "abc", 2, "k1", "k2", "consume", 1)) == "EVALSHA consume k1"
    assert command_text(("TB.ACQUIRE", "k", "2", "30000", "id-1", "1")) == "TB.ACQUIRE k id-1"
    assert command_text(("WAIT", 1, 50)) == "WAIT 1 50"
    assert matches("TB.RELEASE rl:s $id", "TB.RELEASE rl:s x-1", {"$id": "x-1"}, False)
    assert not matches("TB.RELEASE rl:s $id", "TB.RELEASE rl:s x-2", {"$id": "x-1"}, False)
    assert re.fullmatch(r"\d+\.\d+\.\d+\+\w+", library_version())


# ---- replica waits, until clients/spec has its own file ----------------------------

WAIT_FAILURES = {"failures": 2, "window_ms": 10000, "cooldown_ms": 2000}
B10 = {"max": 10, "rate": 1}

WAIT_SCENARIOS = [
    {
        "name": "WAIT behind every consume: fewer replicas turn an admission into the policy's answer",
        "subject": "limiter",
        "limiter": {"backend": "module", "on_error": "closed", "breaker": WAIT_FAILURES, "wait_replicas": 1},
        "steps": [
            {"call": "consume", "key": "rl:k", "bucket": B10,
             "redis": [{"command": "TB.CONSUME rl:k", "reply": [1, 9, 0, 1000]}, {"command": "WAIT 1 50", "reply": 1}],
             "expect": {"allowed": True, "degraded": False, "remaining": 9}},
            {"call": "consume", "key": "rl:k", "bucket": B10,
             "redis": [{"command": "TB.CONSUME rl:k", "reply": [1, 8, 0, 2000]}, {"command": "WAIT 1", "reply": 0}],
             "expect": {"allowed": False, "degraded": True}},
            {"check": {"breaker": "closed"}},
            {"call": "consume", "key": "rl:k", "bucket": B10, "cost": 10,
             "redis": [{"command": "TB.CONSUME rl:k", "reply": [0, 8, 2000, 2000]}, {"command": "WAIT 1", "reply": 0}],
             "expect": {"allowed": False, "degraded": False, "retry_after_ms": 2000}},
            {"check": {"breaker": "closed"}},
            {"call": "peek", "key": "rl:k", "bucket": B10,
             "redis": [{"command": "TB.PEEK rl:k", "reply": [1, 8, 0, 2000]}], "expect": {"allowed": True}},
            {"call": "adjust", "key": "rl:k", "bucket": B10, "delta": 1,
             "redis": [{"command": "TB.ADJUST rl:k", "reply": [1, 9, 0, 1000]}], "expect": {"allowed": True}},
            {"call": "consume_many", "groups": [["rl:a", B10], ["rl:b", B10]], "on_error": "open",
             "redis": [{"command": "TB.MCONSUME rl:a rl:b", "reply": [1, 0, [1, 9, 0, 1000], [1, 9, 0, 1000]]},
                       {"command": "WAIT 1", "reply": 0}],
             "expect": {"allowed": True, "degraded": True}},
            {"check": {"breaker": "open"}},
        ],
    },
    {
        "name": "WAIT behind an acquire: a slot fewer replicas saw is released; renewals and releases wait for none",
        "subject": "limiter",
        "limiter": {"backend": "eval", "on_error": "open", "breaker": False, "wait_replicas": 2, "wait_timeout_ms": 20},
        "steps": [
            {"call": "acquire", "key": "rl:s", "concurrency": {"limit": 2, "lease_ms": 30000}, "id": "a", "as": "a",
             "redis": [{"command": "EVALSHA acquire rl:s", "reply": [1, 1, 0, 30000]},
                       {"command": "WAIT 2 20", "reply": 2}],
             "expect": {"acquired": True, "degraded": False, "held": "redis"}},
            {"call": "renew", "lease": "a", "redis": [{"command": "EVALSHA renew rl:s", "reply": [1, 30000]}],
             "expect": {"result": True}},
            {"call": "release", "lease": "a", "redis": [{"command": "EVALSHA release rl:s", "reply": [1, 0]}],
             "expect": {"result": True}},
            {"call": "acquire", "key": "rl:s", "concurrency": {"limit": 2, "lease_ms": 30000}, "id": "b",
             "redis": [{"command": "EVALSHA acquire rl:s", "error": "NOSCRIPT No matching script. Please use EVAL."},
                       {"command": "WAIT 2", "reply": 2},
                       {"command": "EVAL acquire rl:s", "reply": [1, 1, 0, 30000]}, {"command": "WAIT 2", "reply": 1},
                       {"command": "EVALSHA release rl:s", "reply": [1, 0]}],
             "expect": {"acquired": True, "degraded": True, "held": "none"}},
            {"call": "in_flight", "key": "rl:s", "redis": [{"command": "EVALSHA inflight rl:s", "reply": 0}],
             "expect": {"result": 0}},
        ],
    },
    {
        "name": "WAIT while the backend is found: a write that ran finds it, however few replicas saw it",
        "subject": "limiter",
        "limiter": {"on_error": "open", "breaker": False, "wait_replicas": 1},
        "steps": [
            {"call": "consume", "key": "rl:k", "bucket": B10,
             "redis": [{"command": "TB.CONSUME rl:k", "error": "ERR unknown command 'TB.CONSUME', with args"},
                       {"command": "WAIT 1", "reply": 0},
                       {"command": "FCALL_RO tb_version", "reply": "$LIBRARY_VERSION"},
                       {"command": "FCALL tb_consume rl:k", "reply": [1, 9, 0, 1000]},
                       {"command": "WAIT 1", "reply": 0}],
             "expect": {"allowed": True, "degraded": True}},
            {"check": {"backend": "functions"}},
            {"call": "consume", "key": "rl:k", "bucket": B10,
             "redis": [{"command": "FCALL tb_consume rl:k", "reply": [1, 8, 0, 2000]},
                       {"command": "WAIT 1", "reply": 1}],
             "expect": {"allowed": True, "degraded": False, "remaining": 8}},
        ],
    },
]  # fmt: skip


@pytest.mark.parametrize("flavour", ["sync", "asyncio"])
@pytest.mark.parametrize("scenario", WAIT_SCENARIOS, ids=[s["name"] for s in WAIT_SCENARIOS])
def test_replica_wait(scenario: dict[str, Any], flavour: str) -> None:
    if flavour == "sync":
        run_sync_limiter(scenario)
    else:
        asyncio.run(run_async_limiter(scenario))
