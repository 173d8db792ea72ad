"""Build the dashboards with grafana-foundation-sdk and write them as JSON (a build-time tool:
nothing at run time imports this module or the SDK)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Callable

from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.cog.encoder import JSONEncoder

from . import NAMES, OUT, notes
from .comparison import comparison
from .links import links
from .training import training

DASHBOARDS: dict[str, Callable[[], db.Dashboard]] = dict(zip(NAMES, (links, training, comparison)))


def to_dict(builder: db.Dashboard) -> dict:
    """The dashboard as Grafana's JSON: panels numbered in order, and the Prometheus options
    of each annotation query (which the SDK's AnnotationQuery does not model) added."""
    model = builder.build()
    for i, p in enumerate(model.panels or [], start=1):
        p.id_val = i
    d = json.loads(json.dumps(model, cls=JSONEncoder))
    for a in d["annotations"]["list"]:
        a.update(notes.EXTRAS.get(a["name"], {}))
    return d


def render(d: dict) -> str:
    return json.dumps(d, indent=2) + "\n"


def generate() -> dict[str, str]:
    """File name -> the JSON text committed under compose/grafana/dashboards."""
    return {name: render(to_dict(fn())) for name, fn in DASHBOARDS.items()}


def main(argv: list[str] | None = None) -> None:
    from . import __doc__ as doc

    p = argparse.ArgumentParser(prog="python -m collectors.dashboards", description=doc,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for name, text in generate().items():
        (args.out / name).write_text(text)
        print(args.out / name)
