"""../tb-rules.yml: promtool's checks and unit tests, and that the unit
tests cover every alert both ways (firing, and silent on a calm series)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml

from promstack import PROMTOOL_BIN, RULES

UNIT_TESTS = Path(__file__).with_name("tb-rules.test.yml")


def promtool(*args: str, cwd: Path) -> str:
    run = subprocess.run([PROMTOOL_BIN, *args], cwd=cwd, capture_output=True, text=True)
    assert run.returncode == 0, f"promtool {' '.join(args)}:\n{run.stdout}{run.stderr}"
    return run.stdout


def test_promtool_check_rules_accepts_the_rule_file() -> None:
    out = promtool("check", "rules", RULES.name, cwd=RULES.parent)
    assert "SUCCESS: 11 rules found" in out, out


def test_promtool_unit_tests_pass() -> None:
    out = promtool("test", "rules", UNIT_TESTS.name, cwd=UNIT_TESTS.parent)
    assert "SUCCESS" in out, out


def test_each_alert_fires_in_a_unit_test_beside_a_calm_series_that_stays_silent() -> None:
    rules = yaml.safe_load(RULES.read_text())
    alerts = {r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r}
    assert alerts == {"TokenBucketPanics", "TokenBucketEvictionRisk", "TokenBucketErrorsRising",
                      "TokenBucketDeniedShareJump", "TokenBucketLeasesBusy", "TokenBucketRedisDown",
                      "TokenBucketExporterDown", "TokenBucketGatewayDegraded"}  # fmt: skip
    tests: list[dict[str, Any]] = yaml.safe_load(UNIT_TESTS.read_text())["tests"]
    fired, silent = set(), set()
    for test in tests:
        calm = {s["series"] for s in test["input_series"] if 'instance="c' in s["series"]}
        for case in test.get("alert_rule_test", []):
            if case["exp_alerts"]:
                fired.add(case["alertname"])
                # promtool fails on an alert it did not expect: the calm
                # series of this test, absent here, stayed silent.
                assert calm, f"{case['alertname']}: no calm series beside the firing one"
                assert all(not a["exp_labels"]["instance"].startswith("c") for a in case["exp_alerts"])
            else:
                silent.add(case["alertname"])
    assert fired == alerts
    assert silent == alerts
