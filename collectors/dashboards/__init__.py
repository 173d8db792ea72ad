"""Grafana dashboards for testbed's metrics, generated from code and committed under compose/.

    python -m collectors.dashboards [--out compose/grafana/dashboards]

The dashboards are built with grafana-foundation-sdk (Grafana Labs' builders and types,
generated from Grafana's own schema; see docs/monitoring.md for why not grafanalib) in
:mod:`collectors.dashboards.build`; this module only reads the committed JSON, so the
end-to-end test can run every panel expression, annotation query and variable query
against a real Prometheus (:func:`expressions`) without the SDK. One dashboard per module
(:mod:`.links`, :mod:`.training`, :mod:`.comparison`); :mod:`.parts` holds the panel
conventions and :mod:`.notes` the annotations.
"""

from __future__ import annotations

import re
from pathlib import Path

OUT = Path(__file__).resolve().parents[2] / "compose" / "grafana" / "dashboards"
NAMES = ("links.json", "training.json", "comparison.json")


def panels(d: dict) -> list[dict]:
    """Every panel, rows' collapsed panels included (rows themselves left out)."""
    out = []
    for p in d.get("panels", []):
        if p.get("type") == "row":
            out.extend(p.get("panels", []))
        else:
            out.append(p)
    return out


def expressions(d: dict) -> list[tuple[str, str]]:
    """Every PromQL query in a dashboard as (where, expression): panel targets, annotation
    queries, and the series selector of each ``label_values(...)`` variable query."""
    out = [(f"panel {p['title']!r}", t["expr"]) for p in panels(d) for t in p.get("targets", [])]
    out += [(f"annotation {a['name']!r}", a["expr"]) for a in d["annotations"]["list"] if a.get("expr")]
    for v in d["templating"]["list"]:
        if v.get("type") != "query":
            continue
        q = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
        m = re.fullmatch(r"label_values\((.*),\s*\w+\)", q)
        out.append((f"variable {v['name']!r}", m.group(1) if m else q))
    return out
