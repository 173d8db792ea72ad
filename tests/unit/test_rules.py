"""The shipped Prometheus recording and alerting rules: generated, valid, and each alert tested
by promtool with a case where it fires and one where it does not."""

from __future__ import annotations

import shutil
import subprocess

import pytest
import yaml

from testbed.monitor import rules

TESTS = rules.COMPOSE_RULES.with_name("testbed.rules.test.yml")
needs_promtool = pytest.mark.skipif(shutil.which("promtool") is None,
                                    reason="promtool not installed (Debian package prometheus)")


def test_committed_rules_are_the_generated_ones():
    assert rules.COMPOSE_RULES.read_text() == rules.render(), "run `python -m testbed.monitor.rules --write`"


def test_every_alert_has_a_firing_and_a_quiet_case():
    cases = yaml.safe_load(TESTS.read_text())
    assert cases["rule_files"] == [rules.COMPOSE_RULES.name]
    seen: dict[str, set[str]] = {}
    for group in cases["tests"]:
        for t in group.get("alert_rule_test", []):
            seen.setdefault(t["alertname"], set()).add("fires" if t["exp_alerts"] else "quiet")
    assert seen == {a["alert"]: {"fires", "quiet"} for a in rules.ALERTS}
    recorded = {t["expr"] for g in cases["tests"] for t in g.get("promql_expr_test", [])}
    assert recorded == {r["record"] for r in rules.RECORDING}


@needs_promtool
def test_promtool_checks_and_tests_the_rules(tmp_path):
    r = subprocess.run(["promtool", "check", "rules", str(rules.COMPOSE_RULES)], capture_output=True, text=True)
    n = len(rules.RECORDING) + len(rules.ALERTS)
    assert r.returncode == 0 and f"{n} rules found" in r.stdout, r.stdout + r.stderr
    r = subprocess.run(["promtool", "test", "rules", TESTS.name], capture_output=True, text=True,
                       cwd=TESTS.parent)
    assert r.returncode == 0 and "SUCCESS" in r.stdout, r.stdout + r.stderr


@needs_promtool
def test_promtool_test_fails_when_an_alert_changes(tmp_path):
    """The cases can fail: the bypass alert with its threshold lowered to a tenth no longer
    fires where the test expects it."""
    shutil.copy(TESTS, tmp_path / TESTS.name)
    text = rules.render()
    assert " 0.5 * max by (testbed)" in text
    lowered = text.replace(" 0.5 * max by (testbed)", " 0.001 * max by (testbed)")
    (tmp_path / rules.COMPOSE_RULES.name).write_text(lowered)
    r = subprocess.run(["promtool", "test", "rules", TESTS.name], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode != 0 and "TestbedRunBypassesShapedLinks" in r.stdout + r.stderr, r.stdout + r.stderr
