"""The pieces every dashboard is made of, built with grafana-foundation-sdk's builders.

One convention for all panels: the datasource is the ``$datasource`` template variable (no
uid is written into a panel, so a dashboard imported into another Grafana works); legends
are tables with mean / max / last; every panel has a unit, and a threshold where a value
has a meaning of its own (a utilisation of 1 is a full link).
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import common as cb
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import prometheus as pb
from grafana_foundation_sdk.builders import table as tab
from grafana_foundation_sdk.builders import timeseries as ts
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models import prometheus as pm

# The SDK's enums are enum.StrEnum, new in Python 3.11; mypy checks this code as 3.10, where
# their members read as plain str, so the builders' enum parameters need a type: ignore below.

DS = dm.DataSourceRef(type_val="prometheus", uid="${datasource}")
RATE = "$__rate_interval"
LEGEND_CALCS = ["mean", "max", "lastNotNull"]


def datasource_variable() -> db.DatasourceVariable:
    return db.DatasourceVariable("datasource").label("Prometheus").type("prometheus")


def query_variable(name: str, label: str, metric: str, selector: str = "", multi: bool = True,
                   all_value: str | None = ".*") -> db.QueryVariable:
    """A variable listing the values of ``name`` on ``metric{selector}``. "All" is
    ``all_value`` (any value), or with None the values listed (so filters above it hold)."""
    sel = f"{{{selector}}}" if selector else ""
    v = (db.QueryVariable(name).label(label).datasource(DS)
         .query({"query": f"label_values({metric}{sel}, {name})", "refId": f"var-{name}"})
         .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED).sort(dm.VariableSort.NATURAL_ASC).multi(multi))
    if multi:
        v = v.include_all(True).current(dm.VariableOption(selected=True, text="All", value="$__all"))
        if all_value is not None:
            v = v.all_value(all_value)
    return v


def target(expr: str, legend: str, ref: int, instant: bool = False, table: bool = False) -> pb.Dataquery:
    q = pb.Dataquery().expr(expr).legend_format(legend).ref_id(chr(65 + ref)).datasource(DS)
    if instant:
        q = q.instant()
    if table:
        q = q.format(pm.PromQueryFormat.TABLE)
    return q


def steps(*pairs: tuple[float | None, str]) -> db.ThresholdsConfig:
    """Threshold steps: (value, colour); the first value is None (the base)."""
    return db.ThresholdsConfig().mode(dm.ThresholdsMode.ABSOLUTE).steps(  # type: ignore[arg-type]  # SDK StrEnum, see above
        [dm.Threshold(value=v, color=c) for v, c in pairs])


GREEN = steps((None, "green"))
UTILISATION = steps((None, "green"), (0.8, "orange"), (0.95, "red"))


def timeseries(title: str, targets: list[tuple[str, str]], unit: str, *, description: str = "",
               thresholds: db.ThresholdsConfig = GREEN, min_val: float | None = 0, max_val: float | None = None,
               stacked: bool = False, width: int = 12, height: int = 8) -> ts.Panel:
    p = (ts.Panel().title(title).description(description).datasource(DS).unit(unit).thresholds(thresholds)
         .span(width).height(height).fill_opacity(10 if not stacked else 60)
         .legend(cb.VizLegendOptions().display_mode(cm.LegendDisplayMode.TABLE)  # type: ignore[arg-type]  # SDK StrEnum, see above
                 .placement(cm.LegendPlacement.BOTTOM).show_legend(True).calcs(LEGEND_CALCS))
         .tooltip(cb.VizTooltipOptions().mode(cm.TooltipDisplayMode.MULTI).sort(cm.SortOrder.DESCENDING))  # type: ignore[arg-type]  # SDK StrEnum, see above
         .targets([target(e, leg, i) for i, (e, leg) in enumerate(targets)]))
    if thresholds is not GREEN:
        p = p.thresholds_style(cb.GraphThresholdsStyleConfig().mode(cm.GraphThresholdsStyleMode.DASHED))  # type: ignore[arg-type]  # SDK StrEnum, see above
    if min_val is not None:
        p = p.min(min_val)
    if max_val is not None:
        p = p.max(max_val)
    if stacked:
        p = p.stacking(cb.StackingConfig().mode(cm.StackingMode.NORMAL))  # type: ignore[arg-type]  # SDK StrEnum, see above
    return p


def info_table(title: str, expr: str, *, description: str = "", hide: tuple[str, ...] = (),
               width: int = 24, height: int = 6) -> tab.Panel:
    """The label sets of ``expr`` now, one row each (Time, Value and Prometheus' own labels hidden)."""
    excluded = {k: True for k in ("Time", "Value", "__name__", "instance", "job", *hide)}
    return (tab.Panel().title(title).description(description).datasource(DS).unit("none").thresholds(GREEN)
            .span(width).height(height).targets([target(expr, "", 0, instant=True, table=True)])
            .with_transformation(dm.DataTransformerConfig(id_val="organize",
                                                          options={"excludeByName": excluded})))


def row(title: str) -> db.Row:
    return db.Row(title)


# Options of Grafana's Prometheus annotation query that the SDK's AnnotationQuery does not
# model (the dashboard schema leaves datasource-specific keys to the datasource).
ANNOTATION_EXTRAS = ("titleFormat", "textFormat", "tagKeys", "useValueForTime", "step")


def annotation(name: str, expr: str, colour: str, title: str, tags: str, text: str = "",
               value_is_time: bool = False) -> tuple[db.AnnotationQuery, dict]:
    """A Prometheus annotation. Without ``value_is_time`` every step where ``expr`` is above
    0 is marked (adjacent steps merge into a region); with it, the value is the moment
    marked, in milliseconds. Returns the builder and the Prometheus-specific keys
    :func:`collectors.dashboards.build.render` adds."""
    q = db.AnnotationQuery().name(name).datasource(DS).enable(True).icon_color(colour).expr(expr)
    extras = {"titleFormat": title, "textFormat": text, "tagKeys": tags, "useValueForTime": value_is_time,
              "step": "10s"}
    return q, extras
