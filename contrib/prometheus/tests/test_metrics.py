"""python/tb_metrics.py on its own: each outcome from the event's flags,
the histogram's labels, the watched limiters' gauges read at each scrape,
and the README's snippet run as a reader runs it. That Prometheus scrapes
the same series from a real gateway's traffic is test_live.py's part."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
import urllib.request
from pathlib import Path
from types import SimpleNamespace
from typing import Literal

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from redis_tokenbucket import DecisionEvent

from promstack import CONTRIB, EXAMPLE, Server, wait_for
from tb_metrics import LATENCY_BUCKETS, OUTCOMES, TokenBucketMetrics, outcome

README = CONTRIB / "README.md"


def event(
    allowed: bool = True,
    degraded: bool = False,
    shed: bool = False,
    cached: bool = False,
    op: str = "consume",
    policy: str = "user",
    backend: str = "module",
    latency_s: float = 0.0003,
    shadow: bool = False,
) -> DecisionEvent:
    judged: Literal["within_limit", "over_limit", "shadow_mode"] = (
        "shadow_mode" if shadow else ("within_limit" if allowed else "over_limit")
    )
    return DecisionEvent(op, policy, allowed, degraded, shed, cached, backend, latency_s, "closed", judged)


# What the package can report (docs/failure-model.md): a cached answer is
# always a denial, a shed one never admitted nor degraded.
CASES = [
    (event(allowed=True), "admitted"),
    (event(allowed=False), "denied"),
    (event(allowed=False, cached=True), "cached_denial"),
    (event(allowed=True, shadow=True), "shadow_denied"),
    (event(allowed=True, cached=True, shadow=True), "shadow_denied"),
    (event(allowed=True, degraded=True, backend=""), "degraded_admitted"),
    (event(allowed=False, degraded=True, backend=""), "degraded_denied"),
    (event(allowed=True, degraded=True, backend="local"), "degraded_admitted"),
    (event(allowed=False, shed=True, backend=""), "shed"),
]


@pytest.mark.parametrize(("e", "expected"), CASES, ids=[f"{c[1]}-{i}" for i, c in enumerate(CASES)])
def test_each_outcome(e: DecisionEvent, expected: str) -> None:
    assert outcome(e) == expected


def test_decisions_and_latency_by_their_labels() -> None:
    registry = CollectorRegistry()
    metrics = TokenBucketMetrics(registry)
    for e, _ in CASES:
        metrics.on_decision(e)
    metrics.on_decision(event(op="acquire", policy="streams,user", latency_s=0.02))

    def decisions(op: str, policy: str, result: str) -> float | None:
        return registry.get_sample_value(
            "redis_tokenbucket_decisions_total", {"op": op, "policy": policy, "outcome": result}
        )

    assert [decisions("consume", "user", o) for o in OUTCOMES] == [1, 1, 2, 1, 2, 1, 1]
    assert decisions("acquire", "streams,user", "admitted") == 1
    latency = "redis_tokenbucket_decision_duration_seconds"
    # No backend answered: "none", not an empty label (which Prometheus drops).
    assert registry.get_sample_value(f"{latency}_count", {"op": "consume", "backend": "none"}) == 3
    assert registry.get_sample_value(f"{latency}_count", {"op": "consume", "backend": "module"}) == 5
    assert registry.get_sample_value(f"{latency}_count", {"op": "consume", "backend": "local"}) == 1
    acquire = {"op": "acquire", "backend": "module"}
    assert registry.get_sample_value(f"{latency}_sum", acquire) == pytest.approx(0.02)
    assert registry.get_sample_value(f"{latency}_bucket", {**acquire, "le": "0.01"}) == 0
    assert registry.get_sample_value(f"{latency}_bucket", {**acquire, "le": "0.025"}) == 1
    les = {s.labels["le"] for f in registry.collect() for s in f.samples if s.name == f"{latency}_bucket"}
    assert les == {*(str(b) for b in LATENCY_BUCKETS), "+Inf"}
    # One per registry: the names are taken.
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        TokenBucketMetrics(registry)


def test_watched_limiters_are_read_at_each_scrape() -> None:
    registry = CollectorRegistry()
    metrics = TokenBucketMetrics(registry)
    a = SimpleNamespace(leases_held=0, breaker_state="closed")
    b = SimpleNamespace(leases_held=5, breaker_state="open")
    metrics.watch(a, "a")
    metrics.watch(b, "b")

    def state(name: str) -> dict[str, float | None]:
        return {s: registry.get_sample_value("redis_tokenbucket_breaker_state", {"limiter": name, "state": s})
                for s in ("closed", "open", "half_open")}  # fmt: skip

    def held(name: str) -> float | None:
        return registry.get_sample_value("redis_tokenbucket_leases_held", {"limiter": name})

    assert (held("a"), held("b")) == (0, 5)
    assert state("a") == {"closed": 1, "open": 0, "half_open": 0}
    assert state("b") == {"closed": 0, "open": 1, "half_open": 0}
    a.leases_held, a.breaker_state = 3, "half_open"
    assert held("a") == 3 and state("a") == {"closed": 0, "open": 0, "half_open": 1}
    with pytest.raises(ValueError, match="already watched as 'a'"):
        metrics.watch(b, "a")
    with pytest.raises(ValueError, match="non-empty"):
        metrics.watch(b, "")
    assert held("a") == 3  # the refused watch changed nothing


def test_the_readme_snippet_runs_as_written(tmp_path: Path) -> None:
    """The README's Python block, on a Redis with the module: its
    endpoint (moved to a free port) serves the decision it made."""
    (snippet,) = [b for lang, b in blocks(README.read_text()) if lang == "python"]
    server = Server("redis-7.0", tmp_path / "redis", module=True).start()
    prelude = textwrap.dedent(f"""
        import sys, redis, prometheus_client
        sys.path.insert(0, {str(EXAMPLE.parent)!r})
        class Redis(redis.Redis):  # whatever the snippet names: the test's server
            def __init__(self, *a, **k):
                super().__init__(*a, **{{**k, "host": "127.0.0.1", "port": {server.port}}})
        redis.Redis = Redis
        serve = prometheus_client.start_http_server
        def start_http_server(port, addr="0.0.0.0", **k):  # a free port, announced
            httpd, thread = serve(0, "127.0.0.1", **k)
            print(httpd.server_port, flush=True)
            return httpd, thread
        prometheus_client.start_http_server = start_http_server
    """)
    epilogue = "\nprint('done', flush=True)\nsys.stdin.read()\n"
    proc = subprocess.Popen([sys.executable, "-c", prelude + snippet + epilogue],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        assert proc.stdout.readline().strip() == "done"
        url = f"http://127.0.0.1:{port}/metrics"
        text = wait_for(
            "the metrics", lambda: urllib.request.urlopen(url).read().decode(), lambda t: "tokenbucket" in t
        )
        samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
                   for f in text_string_to_metric_families(text) for s in f.samples}  # fmt: skip
        assert samples[("redis_tokenbucket_decisions_total",
                        (("op", "consume"), ("outcome", "admitted"), ("policy", "user")))] == 1  # fmt: skip
        assert samples[("redis_tokenbucket_leases_held", (("limiter", "default"),))] == 0
        assert samples[("redis_tokenbucket_breaker_state", (("limiter", "default"), ("state", "closed")))] == 1
    finally:
        proc.kill()
        proc.wait()
        server.stop()


def blocks(markdown: str) -> list[tuple[str, str]]:
    """(language, code) of each fenced block."""
    return [(m.group(1), m.group(2)) for m in re.finditer(r"^```(\w*)\n(.*?)^```$", markdown, re.MULTILINE | re.DOTALL)]
