"""Grafana dashboards for testbed's metrics, generated here and committed under compose/.

    python -m collectors.dashboards [--out compose/grafana/dashboards]

One place defines every panel's PromQL, so the e2e test can run each expression against
a real Prometheus (``expressions()``, template variables substituted) and a unit test can
check that the committed JSON is what this module generates.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

DATASOURCE = {"type": "prometheus", "uid": "testbed-prometheus"}
OUT = Path(__file__).resolve().parents[1] / "compose" / "grafana" / "dashboards"
RATE = "$__rate_interval"
LINK_SEL = 'testbed=~"$testbed",link=~"$link"'
RUN_SEL = 'run_id=~"$run_id"'
ITER_S = (f"rate(testbed_train_iteration_seconds_sum{{{RUN_SEL}}}[{RATE}])"
          f" / rate(testbed_train_iteration_seconds_count{{{RUN_SEL}}}[{RATE}])")


def _var(name: str, query: str, label: str, multi: bool = True) -> dict:
    return {"name": name, "label": label, "type": "query", "datasource": DATASOURCE,
            "query": {"query": query, "refId": f"var-{name}"}, "definition": query, "refresh": 2,
            "includeAll": multi, "multi": multi, "allValue": ".*" if multi else None, "sort": 1,
            "current": {"selected": True, "text": ["All"], "value": ["$__all"]} if multi else {}}


def _panel(i: int, title: str, targets: list[tuple[str, str]], unit: str, w: int = 12, h: int = 8,
           kind: str = "timeseries") -> dict:
    return {"id": i + 1, "type": kind, "title": title, "datasource": DATASOURCE,
            "gridPos": {"x": (i % (24 // w)) * w, "y": (i // (24 // w)) * h, "w": w, "h": h},
            "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
            "options": {"legend": {"displayMode": "list", "placement": "bottom"}},
            "targets": [{"refId": chr(65 + k), "datasource": DATASOURCE, "expr": e, "legendFormat": leg}
                        for k, (e, leg) in enumerate(targets)]}


def _dashboard(uid: str, title: str, variables: list[dict], panels: list[dict]) -> dict:
    return {"uid": uid, "title": title, "tags": ["testbed"], "timezone": "browser", "schemaVersion": 39,
            "version": 1, "editable": True, "refresh": "5s", "time": {"from": "now-30m", "to": "now"},
            "templating": {"list": variables}, "panels": panels, "annotations": {"list": []}}


def links() -> dict:
    util = (f"rate(testbed_link_transmit_bytes_total{{{LINK_SEL}}}[{RATE}])"
            f" / on(testbed, link, direction) group_left testbed_link_capacity_bytes_per_second{{{LINK_SEL}}}")
    panels = [
        _panel(0, "Utilisation (rate x 8 / capacity)", [(util, "{{testbed}} {{link}} {{src}}->{{dst}}")],
               "percentunit", w=24),
        _panel(1, "Throughput under capacity (a trace steps the capacity)",
               [(f"rate(testbed_link_transmit_bytes_total{{{LINK_SEL}}}[{RATE}]) * 8", "{{link}} {{src}}->{{dst}}"),
                (f"testbed_link_capacity_bytes_per_second{{{LINK_SEL}}} * 8", "capacity {{link}} {{src}}->{{dst}}")],
               "bps"),
        _panel(2, "Capacity", [(f"testbed_link_capacity_bytes_per_second{{{LINK_SEL}}} * 8",
                                "{{link}} {{src}}->{{dst}}")], "bps"),
        _panel(3, "Queue backlog", [(f"testbed_link_backlog_bytes{{{LINK_SEL}}}", "{{link}} {{src}}->{{dst}}")],
               "bytes"),
        _panel(4, "Drops and overlimits per second",
               [(f"rate(testbed_link_drops_total{{{LINK_SEL}}}[{RATE}])", "drops {{link}} {{direction}}"),
                (f"rate(testbed_link_overlimits_total{{{LINK_SEL}}}[{RATE}])", "overlimits {{link}} {{direction}}")],
               "pps"),
    ]
    return _dashboard("testbed-links", "testbed: link utilisation",
                      [_var("testbed", "label_values(testbed_link_capacity_bytes_per_second, testbed)", "testbed"),
                       _var("link", 'label_values(testbed_link_capacity_bytes_per_second{testbed=~"$testbed"}, link)',
                            "link")], panels)


def training() -> dict:
    per_iter = "rate({m}{{{sel}}}[{r}]) / rate(testbed_train_iterations_total{{{sel}}}[{r}])"
    panels = [
        _panel(0, "Iteration time", [(ITER_S, "{{run_id}} rank {{rank}}")], "s"),
        _panel(1, "Throughput (iterations/s, rank 0)",
               [(f'rate(testbed_train_iterations_total{{{RUN_SEL},rank="0"}}[{RATE}])', "{{run_id}}")], "none"),
        _panel(2, "Training loss", [(f"testbed_train_loss{{{RUN_SEL}}}", "{{run_id}} rank {{rank}}")], "none"),
        _panel(3, "Test accuracy", [(f"testbed_train_accuracy{{{RUN_SEL}}}", "{{run_id}}")], "percentunit"),
        _panel(4, "Payload vs wire bytes per iteration",
               [(per_iter.format(m="testbed_train_payload_bytes_total", sel=RUN_SEL, r=RATE), "payload {{run_id}} {{rank}}"),
                (per_iter.format(m="testbed_train_wire_bytes_total", sel=RUN_SEL, r=RATE), "wire {{run_id}} {{rank}}")],
               "bytes"),
        _panel(5, "Compression ratio (payload / dense)",
               [(f"testbed_train_compression_ratio{{{RUN_SEL}}}", "{{run_id}} rank {{rank}}")], "percentunit"),
        _panel(6, "Cross-traffic (received by its iperf3 server)",
               [(f"testbed_cross_traffic_bits_per_second{{{RUN_SEL}}}", "{{run_id}} {{label}}")], "bps", w=24),
    ]
    return _dashboard("testbed-training", "testbed: training",
                      [_var("run_id", "label_values(testbed_run_info, run_id)", "run")], panels)


def comparison() -> dict:
    sel = 'bw="$bw"'
    panels = [
        _panel(0, "Iteration time by scheme",
               [(f"avg by (scheme) (rate(testbed_train_iteration_seconds_sum{{{sel}}}[{RATE}])"
                 f" / rate(testbed_train_iteration_seconds_count{{{sel}}}[{RATE}]))", "{{scheme}}")], "s"),
        _panel(1, "Test accuracy by run", [(f"max by (scheme, run_id) (testbed_train_accuracy{{{sel}}})",
                                            "{{scheme}} {{run_id}}")], "percentunit"),
        _panel(2, "Payload bytes per iteration by scheme",
               [(f"avg by (scheme) (rate(testbed_train_payload_bytes_total{{{sel}}}[{RATE}])"
                 f" / rate(testbed_train_iterations_total{{{sel}}}[{RATE}]))", "{{scheme}}")], "bytes"),
        _panel(3, "Iterations completed by scheme",
               [(f'max by (scheme, run_id) (testbed_train_iterations_total{{{sel},rank="0"}})',
                 "{{scheme}} {{run_id}}")], "none"),
        _panel(4, "Bottleneck utilisation", [(
            f'rate(testbed_link_transmit_bytes_total{{bottleneck="true"}}[{RATE}])'
            ' / on(testbed, link, direction) group_left testbed_link_capacity_bytes_per_second{bottleneck="true"}',
            "{{testbed}} {{link}} {{direction}}")], "percentunit", w=24),
    ]
    return _dashboard("testbed-comparison", "testbed: schemes at one bandwidth",
                      [_var("bw", "label_values(testbed_run_info, bw)", "bandwidth", multi=False)], panels)


DASHBOARDS = {"links.json": links, "training.json": training, "comparison.json": comparison}


def render(d: dict) -> str:
    return json.dumps(d, indent=2) + "\n"


def expressions(d: dict) -> list[str]:
    """Every PromQL expression in a dashboard: panel targets and variable queries."""
    out = [t["expr"] for p in d["panels"] for t in p["targets"]]
    for v in d["templating"]["list"]:
        m = re.fullmatch(r"label_values\((.*),\s*\w+\)", v["query"]["query"])
        out.append(m.group(1) if m else v["query"]["query"])
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for name, fn in DASHBOARDS.items():
        (args.out / name).write_text(render(fn()))
        print(args.out / name)


if __name__ == "__main__":
    main()
