"""The shipped Grafana dashboards: generated, valid against Grafana's schema, portable, consistent."""

from __future__ import annotations

import copy
import enum
import json
import re
import types
import typing

import pytest

from collectors import dashboards

sdk = pytest.importorskip("grafana_foundation_sdk", reason="grafana-foundation-sdk not installed (Python >= 3.11)")

from grafana_foundation_sdk.cog.encoder import JSONEncoder  # noqa: E402
from grafana_foundation_sdk.cog.plugins import register_default_plugins  # noqa: E402
from grafana_foundation_sdk.models.dashboard import Dashboard  # noqa: E402

from collectors.dashboards import build  # noqa: E402
from collectors.dashboards.parts import ANNOTATION_EXTRAS  # noqa: E402

register_default_plugins()  # panel options and queries decode into their plugins' types


def _committed() -> dict[str, dict]:
    return {name: json.loads((dashboards.OUT / name).read_text()) for name in dashboards.NAMES}


def _type_errors(obj, path: str) -> list[str]:
    """Each attribute of an SDK model object against its type annotation, recursively."""
    errors = []
    hints = typing.get_type_hints(type(obj), vars(__import__(type(obj).__module__, fromlist=["_"])))
    for name, hint in hints.items():
        errors += _check(getattr(obj, name, None), hint, f"{path}.{name}")
    return errors


def _check(value, hint, path: str) -> list[str]:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return []
        tries = [_check(value, a, path) for a in args if a is not type(None)]
        return [] if any(not t for t in tries) else tries[0]
    if origin is typing.Literal:
        return [] if value in args else [f"{path}: {value!r} is not one of {args}"]
    if origin is list:
        if not isinstance(value, list):
            return [f"{path}: {type(value).__name__}, not a list"]
        return [e for i, v in enumerate(value) for e in _check(v, args[0], f"{path}[{i}]")]
    if origin is dict:
        return [] if isinstance(value, dict) else [f"{path}: {type(value).__name__}, not an object"]
    if hint is object or hint is typing.Any:
        return _type_errors(value, path) if hasattr(value, "to_json") else []
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return [] if value in {e.value for e in hint} else [f"{path}: {value!r} is not a {hint.__name__}"]
    if isinstance(value, dict) and isinstance(hint, type) and hasattr(hint, "from_json"):
        decoded = hint.from_json(value)  # left undecoded by its parent (a panel's transformations)
        again = json.loads(json.dumps(decoded, cls=JSONEncoder))
        return _type_errors(decoded, path) + [f"{w}: not in the schema" for w in _lost(value, again, path)]
    if hint is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    elif hint is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = isinstance(value, hint)
    if not ok:
        return [f"{path}: {type(value).__name__} {value!r:.40}, not {getattr(hint, '__name__', hint)}"]
    return _type_errors(value, path) if hasattr(value, "to_json") else []


def schema_errors(d: dict) -> list[str]:
    """What Grafana's dashboard schema (grafana-foundation-sdk's types, generated from it)
    rejects: keys it does not know (decoding drops them, so the JSON does not survive the
    round trip) and values of the wrong type. An annotation's Prometheus options are the
    datasource's, outside the dashboard schema: they are set aside."""
    d = copy.deepcopy(d)
    for a in d.get("annotations", {}).get("list", []):
        for k in ANNOTATION_EXTRAS:
            a.pop(k, None)
    model = Dashboard.from_json(d)
    errors = _type_errors(model, "dashboard")
    again = json.loads(json.dumps(model, cls=JSONEncoder))
    errors += [f"{where}: not in the schema" for where in _lost(d, again, "")]
    return errors


def _lost(a, b, path: str) -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        return [x for k in a for x in (_lost(a[k], b[k], f"{path}/{k}") if k in b else [f"{path}/{k}"])]
    if isinstance(a, list) and isinstance(b, list):
        return [x for i, (u, v) in enumerate(zip(a, b)) for x in _lost(u, v, f"{path}[{i}]")]
    return [] if a == b else [f"{path} ({a!r:.40} became {b!r:.40})"]


def test_committed_dashboards_are_the_generated_ones():
    for name, text in build.generate().items():
        committed = (dashboards.OUT / name).read_text()
        assert committed == text, f"run `python -m collectors.dashboards` ({name} is stale)"


def test_dashboards_validate_against_grafanas_schema():
    for name, d in _committed().items():
        assert schema_errors(d) == [], name


@pytest.mark.parametrize("damage, where", [
    (lambda d: d["panels"][1].__setitem__("fieldconfig", {}), "/panels[1]/fieldconfig"),  # a misspelt key
    (lambda d: d["panels"][1]["gridPos"].__setitem__("w", "12"), "grid_pos.w"),  # a string for a number
    (lambda d: d["panels"][1]["options"]["legend"].__setitem__("displayMode", "tabel"), "display_mode"),
    (lambda d: d["templating"]["list"][1].__setitem__("refresh", 7), "refresh"),
])
def test_schema_check_finds_damage(damage, where):
    d = _committed()["links.json"]
    damage(d)
    errors = schema_errors(d)
    assert any(where in e for e in errors), errors


def _datasource_refs(node, path="") -> list[tuple[str, dict]]:
    out = []
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "datasource" and isinstance(v, dict):
                out.append((path, v))
            out += _datasource_refs(v, f"{path}/{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _datasource_refs(v, f"{path}[{i}]")
    return out


def test_importing_with_another_datasource_uid_leaves_no_panel_on_the_old_one():
    """What Grafana does on import into another instance: the datasource variable takes that
    instance's Prometheus; every query must follow it (none may name the provisioned uid)."""
    for name, d in _committed().items():
        (var,) = [v for v in d["templating"]["list"] if v["type"] == "datasource"]
        assert var["name"] == "datasource" and var["query"] == "prometheus"
        var["current"] = {"selected": True, "text": "their Prometheus", "value": "their-uid"}
        text = json.dumps(d).replace("${datasource}", var["current"]["value"])  # Grafana interpolates the variable
        assert "testbed-prometheus" not in text, name
        refs = _datasource_refs(json.loads(text))
        queried = [p for p in dashboards.panels(d) if p.get("targets")]
        assert len(refs) >= len(queried) + len(d["annotations"]["list"]), name
        assert {r["uid"] for _, r in refs} == {"their-uid"}, [p for p, r in refs if r["uid"] != "their-uid"]
        for p in queried:
            assert all(t["datasource"]["uid"] == "${datasource}" for t in p["targets"]), (name, p["title"])


def test_panels_have_units_thresholds_and_table_legends():
    for name, d in _committed().items():
        for p in dashboards.panels(d):
            defaults = p["fieldConfig"]["defaults"]
            assert defaults.get("unit"), (name, p["title"])
            assert defaults["thresholds"]["steps"], (name, p["title"])
            if p["type"] == "timeseries":
                legend = p["options"]["legend"]
                assert legend["displayMode"] == "table" and legend["calcs"] == ["mean", "max", "lastNotNull"]
            if defaults["unit"] == "percentunit" and "tilisation" in p["title"]:
                assert defaults["max"] == 1 and len(defaults["thresholds"]["steps"]) == 3, (name, p["title"])


def test_variables_filter_and_every_variable_used_is_defined():
    want = {"links.json": {"datasource", "testbed", "link"},
            "training.json": {"datasource", "testbed", "scheme", "bw", "run_id", "rank"},
            "comparison.json": {"datasource", "bw", "scheme"}}
    for name, d in _committed().items():
        defined = {v["name"] for v in d["templating"]["list"]}
        assert defined == want[name]
        used = {m for _, e in dashboards.expressions(d) for m in re.findall(r"\$(\w+)", e)} - {"__rate_interval",
                                                                                              "__range"}
        assert used <= defined, (name, used - defined)
        assert {n for n in defined - {"datasource"}} <= used, (name, "a variable no query uses")
    # the comparison's bottleneck panel follows $bw (it ignored it once)
    (p,) = [p for p in dashboards.panels(_committed()["comparison.json"]) if p["title"].startswith("Bottleneck")]
    assert 'bw="$bw"' in p["targets"][0]["expr"]


def test_link_series_are_named_by_testbed_and_direction_alike():
    d = _committed()["links.json"]
    for p in dashboards.panels(d):
        for t in p["targets"]:
            if "testbed_link_" in t["expr"] and "scrape_ok" not in t["expr"]:
                assert "{{testbed}} {{link}} {{src}}->{{dst}}" in t["legendFormat"], (p["title"], t["legendFormat"])


def test_annotations_mark_runs_shape_changes_and_cross_traffic():
    for name, d in _committed().items():
        notes = {a["name"]: a for a in d["annotations"]["list"]}
        assert set(notes) == {"Run started", "Run ended", "Link shape changed (trace step, link set, --bw)",
                              "Cross-traffic on"}, name
        for note, metric in (("Run started", "testbed_run_start_time_seconds"),
                             ("Run ended", "testbed_run_end_time_seconds")):
            assert notes[note]["useValueForTime"] and metric in notes[note]["expr"], (name, note)
        shape = notes["Link shape changed (trace step, link set, --bw)"]
        assert shape["useValueForTime"] and "testbed_link_shape_change_time_seconds" in shape["expr"], name
        assert "testbed_cross_traffic_active" in notes["Cross-traffic on"]["expr"]


def test_expressions_cover_panels_annotations_and_variables():
    d = _committed()["training.json"]
    where = [w.split()[0] for w, _ in dashboards.expressions(d)]
    n_targets = sum(len(p["targets"]) for p in dashboards.panels(d))
    assert where.count("panel") == n_targets and where.count("annotation") == 4 and where.count("variable") == 5


def test_nothing_at_run_time_imports_the_sdk():
    """The SDK is a build-time tool: the exporters, the CLI and the run exporter work without it."""
    import subprocess
    import sys

    code = ("import sys, collectors.__main__, collectors.dashboards, testbed.cli.monitor, testbed.runs.exporter, "
            "testbed.monitor.prometheus; "
            "print(sorted(m for m in sys.modules if m.startswith('grafana_foundation_sdk')))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stdout + r.stderr
