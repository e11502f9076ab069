"""../tb-dashboard.json without Grafana (which can't be installed here):
its structure through Grafana's own generated models (the
grafana-foundation-sdk package), the layout and references by hand, and
every PromQL query through a parser. That the queries run on a real
Prometheus and name series it has is test_live.py's part."""

from __future__ import annotations

import json
import re
from typing import Any

import promql_parser
import pytest
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.cog.plugins import register_default_plugins
from grafana_foundation_sdk.models.dashboard import Dashboard

import dashboard
from dashboard import Query

GRID_WIDTH = 24


@pytest.fixture
def board() -> dict[str, Any]:
    return dashboard.load()


def dropped_keys(original: Any, decoded: Any, path: str = "") -> list[str]:
    """Keys of `original` that `decoded` lacks: what the models don't know."""
    if isinstance(original, dict) and isinstance(decoded, dict):
        lost = [f"{path}/{k}" for k in original if k not in decoded]
        for k in original.keys() & decoded.keys():
            lost += dropped_keys(original[k], decoded[k], f"{path}/{k}")
        return lost
    if isinstance(original, list) and isinstance(decoded, list) and len(original) == len(decoded):
        return [
            x
            for i, (a, b) in enumerate(zip(original, decoded, strict=True))
            for x in dropped_keys(a, b, f"{path}[{i}]")
        ]
    return []


def test_grafanas_models_know_every_key(board: dict[str, Any]) -> None:
    # The SDK's decoder keeps the keys its models (Grafana 11.6's schema,
    # panel options of each panel type, Prometheus queries) define, and
    # drops any other: a misspelled key anywhere shows up as dropped.
    register_default_plugins()
    decoded = json.loads(json.dumps(Dashboard.from_json(board), cls=JSONEncoder))
    assert dropped_keys(board, decoded) == []
    assert len(decoded["panels"]) == len(board["panels"])


def test_panels_tile_the_grid_with_unique_ids(board: dict[str, Any]) -> None:
    panels = list(dashboard.panels(board))
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    cells: dict[tuple[int, int], str] = {}
    for p in panels:
        g = p["gridPos"]
        assert all(isinstance(g[k], int) and g[k] >= 0 for k in "xywh"), p["title"]
        assert g["w"] > 0 and g["h"] > 0 and g["x"] + g["w"] <= GRID_WIDTH, p["title"]
        if p["type"] == "row":
            assert (g["x"], g["w"], g["h"]) == (0, GRID_WIDTH, 1), p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{p['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = p["title"]


def test_queries_use_the_prometheus_datasource_variable(board: dict[str, Any]) -> None:
    variables = dashboard.variables(board)
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    source = {"type": "prometheus", "uid": "${datasource}"}
    for p in dashboard.panels(board):
        if p["type"] in ("row", "text"):
            assert "targets" not in p, p["title"]
            continue
        assert p["type"] in ("timeseries", "stat"), p["title"]
        assert p["datasource"] == source, p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert refs and len(refs) == len(set(refs)), p["title"]
        assert all(t["datasource"] == source and t["expr"].strip() for t in p["targets"]), p["title"]


def test_every_query_parses_and_names_its_metrics(board: dict[str, Any]) -> None:
    queries = dashboard.queries(board)
    assert len(queries) == 36  # 33 panel queries, the $instance, $gateway and $rls variables
    for q in queries:
        promql_parser.parse(q.expr)  # raises on a syntax error
        assert q.metric_names(), q.where


def test_an_undefined_variable_is_refused(board: dict[str, Any]) -> None:
    with pytest.raises(KeyError, match="nosuch"):
        dashboard.fill("rate(x{instance=~'$nosuch'}[$__rate_interval])", board)


def used_series(board: dict[str, Any], prefix: str, exported: Any, labels_of: Any, whose: str) -> set[str]:
    """The series under `prefix` the panels select, each checked to be one
    `exported` holds and to select only the labels `labels_of(name)` allows."""
    used: set[str] = set()
    for q in dashboard.queries(board):
        for selector in q.selectors():
            (name,) = Query(q.where, selector).metric_names()
            if name.startswith(prefix):
                used.add(name)
                assert name in exported, f"{q.where}: {name} is not a series of {whose}"
                labels = set(re.findall(r"(\w+)(?:=|!=|=~|!~)", selector)) - {"__name__"}
                assert labels <= labels_of(name), f"{q.where}: {selector}"
    return used


def test_the_client_series_are_the_examples_own(board: dict[str, Any]) -> None:
    """The gateway panels name exactly the series python/tb_metrics.py
    exports (a histogram through its buckets), with its labels, under the
    $gateway variable (the exporters' $instance is another set)."""
    exported = dashboard.client_series()
    used = used_series(
        board, dashboard.CLIENT_PREFIX, exported, lambda n: exported[n] | {"instance", "job"}, "the example"
    )
    assert used == {n for n in exported if not n.endswith(("_count", "_sum"))}
    for p in dashboard.panels(board):
        for t in p.get("targets", []):
            if dashboard.CLIENT_PREFIX in t["expr"]:
                assert "$gateway" in t["expr"] and "$instance" not in t["expr"], p["title"]


def test_the_rls_series_are_tb_rls_own(board: dict[str, Any]) -> None:
    """The tb-rls panels name only series rls/src/metrics.rs writes, with
    its labels, under the $rls variable; its tests (rls/tests/metrics.rs)
    check the values a real tb-rls serves."""
    exported = dashboard.rls_series()
    assert len(exported) == 17, sorted(exported)
    used = used_series(board, dashboard.RLS_PREFIX, exported, lambda n: {"instance", "job"}, "tb-rls")
    for stat in ("total_hits", "over_limit", "near_limit", "within_limit", "shadow_mode"):
        assert f"ratelimit_service_rate_limit_{stat}" in exported
    assert used <= set(exported)
    for p in dashboard.panels(board):
        for t in p.get("targets", []):
            if dashboard.RLS_PREFIX in t["expr"]:
                assert "$rls" in t["expr"] and "$instance" not in t["expr"], p["title"]
    by_title = {p["title"]: p for p in dashboard.panels(board)}
    assert by_title["tb-rls over-limit share by descriptor"]["fieldConfig"]["defaults"]["unit"] == "percentunit"
    exprs = " ".join(t["expr"] for t in by_title["tb-rls over-limit share by descriptor"]["targets"])
    assert "by (domain, descriptor)" in exprs


def test_the_issues_panels_are_there(board: dict[str, Any]) -> None:
    """Issue 27's list: admitted and denied per second, the denied share,
    TB.* calls and latency from redis_commands_*, errors and panics, leases
    (acquired and busy per second, the busy share, held by gateways), and
    the Python package's hook beside the server's series."""
    by_title = {p["title"]: p for p in dashboard.panels(board)}
    exprs = {title: " ".join(t["expr"] for t in p.get("targets", [])) for title, p in by_title.items()}
    assert 'tb_admitted"' in exprs["Admitted and denied per second"]
    assert 'tb_denied"' in exprs["Admitted and denied per second"]
    assert "tb_denied" in exprs["Denied share"]
    assert by_title["Denied share"]["fieldConfig"]["defaults"]["unit"] == "percentunit"
    assert "redis_commands_total" in exprs["Calls per second"]
    assert "redis_commands_duration_seconds_total" in exprs["Mean latency per call"]
    assert "redis_latency_percentiles_usec" in exprs["Latency percentiles since the server started"]
    assert "tb_errors" in exprs["Errors per second"]
    assert "tb_panics" in exprs["Panics since the module loaded"]
    assert 'tb_acquired"' in exprs["Lease calls per second"] and 'tb_busy"' in exprs["Lease calls per second"]
    assert "tb_busy" in exprs["Busy share of lease acquires"]
    assert by_title["Busy share of lease acquires"]["fieldConfig"]["defaults"]["unit"] == "percentunit"
    assert "redis_tokenbucket_leases_held" in exprs["Leases held by gateway processes"]
    assert "by (outcome)" in exprs["Gateway decisions per second by outcome"]
    assert "by (policy)" in exprs["Gateway denied share by policy"]
    assert "histogram_quantile" in exprs["Gateway decision latency"]
    assert "redis_tokenbucket_breaker_state" in exprs["Gateway limiters by breaker state"]
    assert not [p for p in dashboard.panels(board) if p["type"] == "text" or "placeholder" in p["title"].lower()]
