"""Reading ../tb-dashboard.json for the tests: its panels, its PromQL
queries with Grafana's variables filled in, and the series selectors in
each query (found by a PromQL parser, promql-parser)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import promql_parser
from prometheus_client import CollectorRegistry
from redis_tokenbucket import DecisionEvent

from promstack import DASHBOARD
from tb_metrics import TokenBucketMetrics

# Grafana's own variables, with values a Prometheus query can take.
BUILTINS = {"__rate_interval": "1m", "__interval": "1m", "__range": "1h"}
# $name, ${name}, ${name:format}, [[name]]
VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]")
LABEL_VALUES = re.compile(r"label_values\((?:(.+),\s*)?(\w+)\)")


# The series of the Python package's example hook (python/tb_metrics.py).
CLIENT_PREFIX = "redis_tokenbucket_"


def client_series() -> dict[str, set[str]]:
    """Every series name python/tb_metrics.py exports, with its label names:
    found by feeding it an event and a watched limiter, and collecting."""
    registry = CollectorRegistry()
    metrics = TokenBucketMetrics(registry)
    metrics.on_decision(DecisionEvent("consume", "user", True, False, False, False, "module", 0.001, "closed"))
    metrics.watch(SimpleNamespace(leases_held=0, breaker_state="closed"))
    return {
        sample.name: set(sample.labels)
        for family in registry.collect()
        for sample in family.samples
        if sample.name.startswith(CLIENT_PREFIX) and not sample.name.endswith("_created")
    }


# The series tb-rls serves on /metrics (rls/src/metrics.rs).
RLS_PREFIX = "ratelimit_service_"
RLS_METRICS = Path(__file__).resolve().parents[3] / "rls" / "src" / "metrics.rs"


def rls_series() -> set[str]:
    """Every series name rls/src/metrics.rs writes: its literal names and
    the five per-descriptor families of its STATS, ratelimit_service_rate_limit_{stat}."""
    src = RLS_METRICS.read_text()
    names = set(re.findall(r'"(ratelimit_service_\w+)"', src))
    table = re.search(r"pub const STATS: \[\(&str, &str\); 5\] = \[(.*?)\];", src, re.S)
    assert table, f"no STATS table in {RLS_METRICS}"
    stats = re.findall(r'\(\s*"(\w+)",', table.group(1))
    assert len(stats) == 5, stats
    return names | {f"ratelimit_service_rate_limit_{s}" for s in stats}


def load() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, rows and the panels of collapsed rows included."""
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])


def variables(dashboard: dict[str, Any]) -> dict[str, Any]:
    return {v["name"]: v for v in dashboard["templating"]["list"]}


@dataclass(frozen=True)
class Query:
    where: str  # panel title and refId, or the variable's name
    expr: str  # with the variables filled in

    def selectors(self) -> list[str]:
        """The series selectors of the query, each as {__name__="...", ...}."""
        found: list[str] = []

        def visit(node: Any) -> bool:
            if isinstance(node, promql_parser.VectorSelector):
                matchers = [f'__name__="{node.name}"'] if node.name else []
                for m in node.matchers.matchers:
                    matchers.append(f"{m.name}{OPS[str(m.op)]}{json.dumps(m.value)}")
                found.append("{" + ", ".join(matchers) + "}")
            return True

        promql_parser.walk(promql_parser.parse(self.expr), visit)
        return found

    def metric_names(self) -> set[str]:
        names = set()
        for selector in self.selectors():
            name = re.match(r'\{__name__="([^"]+)"', selector)
            if name is None:
                raise ValueError(f"{self.where}: a selector without a metric name: {selector}")
            names.add(name.group(1))
        return names


OPS = {"MatchOp.Equal": "=", "MatchOp.NotEqual": "!=", "MatchOp.Re": "=~", "MatchOp.NotRe": "!~"}


def fill(text: str, dashboard: dict[str, Any]) -> str:
    """Fills in Grafana's variables: a query variable by its "All" value,
    the built-ins by a value Prometheus takes. An unknown one raises."""
    defined = variables(dashboard)

    def value(match: re.Match[str]) -> str:
        name = next(g for g in match.groups() if g)
        if name in BUILTINS:
            return BUILTINS[name]
        if name not in defined:
            raise KeyError(f"variable ${name} is not defined in the dashboard")
        all_value: str = defined[name]["allValue"]
        return all_value

    return VARIABLE.sub(value, text)


def queries(dashboard: dict[str, Any]) -> list[Query]:
    """The PromQL of every panel target and of every query variable
    (label_values(selector, label) becomes the selector's series)."""
    found = []
    for panel in panels(dashboard):
        for target in panel.get("targets", []):
            found.append(Query(f"{panel['title']} / {target['refId']}", fill(target["expr"], dashboard)))
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            text = variable["query"]["query"]
            match = LABEL_VALUES.fullmatch(text)
            if match is None or match.group(1) is None:
                raise ValueError(f"${variable['name']}: expected label_values(selector, label), got {text}")
            found.append(Query(f"${variable['name']}", fill(match.group(1), dashboard)))
    return found
