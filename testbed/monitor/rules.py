"""Prometheus recording and alerting rules for testbed's metrics, kept here as data.

`testbed monitor up` writes them next to its generated ``prometheus.yml`` (as ``rules.yml``)
and lists them under ``rule_files``; the compose Prometheus mounts the same rules, committed
as ``compose/prometheus/rules/testbed.rules.yml`` (``python -m testbed.monitor.rules
--write`` regenerates it; a unit test fails when they differ). Their ``promtool test
rules`` cases sit beside it in ``testbed.rules.test.yml``.

Recording rules (``level:metric:operations``):

- ``testbed:link_utilisation:ratio_rate1m``: bytes sent per second over the configured
  rate, per link direction;
- ``testbed:bottleneck_transmit_bytes:rate1m``: bytes per second into a testbed's
  bottleneck directions, summed;
- ``testbed:run_payload_bytes:rate1m``: per run, the bytes per second its busiest rank
  hands to collectives, with the run's testbed;
- ``testbed:run_iterations:rate1m``: per run, rank 0's iterations per second, with the
  run's testbed.

Alerts:

- ``TestbedRunBypassesShapedLinks``: a run sends gradients, but its testbed's bottleneck
  links carry less than half of one rank's payload: its collectives take another path (a
  route around the shaped links, a loopback), so the measured times mean nothing. Assumes
  ranks on both sides of a bottleneck (every shipped topology); `testbed run` checks the
  same from the tc counters at the end of every run, this sees it while it runs.
- ``TestbedExporterDown``: Prometheus cannot scrape one of testbed's exporters.
- ``TestbedLinkCountersUnreadable``: a link exporter answers but cannot read its
  testbed's tc counters (the testbed is half gone, or netlink refuses).
- ``TestbedRunStalledOnSaturatedLink``: a bottleneck is full while a run on its testbed
  makes no progress: the run waits on a link that cross-traffic (or a too small trace
  step) has taken.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import yaml

COMPOSE_RULES = Path(__file__).resolve().parents[2] / "compose" / "prometheus" / "rules" / "testbed.rules.yml"

# the run's testbed, from its info series (training series carry run_id, not testbed)
_RUN_TESTBED = "on(run_id) group_left(testbed) max by (run_id, testbed) (testbed_run_info)"

RECORDING = [
    {"record": "testbed:link_utilisation:ratio_rate1m",
     "expr": "rate(testbed_link_transmit_bytes_total[1m])"
             " / on(testbed, link, direction) group_left testbed_link_capacity_bytes_per_second"},
    {"record": "testbed:bottleneck_transmit_bytes:rate1m",
     "expr": 'sum by (testbed) (rate(testbed_link_transmit_bytes_total{bottleneck="true"}[1m]))'},
    {"record": "testbed:run_payload_bytes:rate1m",
     "expr": f"max by (testbed, run_id, scheme, bw) (rate(testbed_train_payload_bytes_total[1m]) * {_RUN_TESTBED})"},
    {"record": "testbed:run_iterations:rate1m",
     "expr": "max by (testbed, run_id, scheme, bw) "
             f'(rate(testbed_train_iterations_total{{rank="0"}}[1m]) * {_RUN_TESTBED})'},
]

ALERTS = [
    {"alert": "TestbedRunBypassesShapedLinks",
     "expr": "testbed:bottleneck_transmit_bytes:rate1m"
             " < on(testbed) 0.5 * max by (testbed) (testbed:run_payload_bytes:rate1m > 0)",
     "for": "1m", "labels": {"severity": "critical"},
     "annotations": {"summary": "A run on testbed {{ $labels.testbed }} sends gradients that do not cross its "
                                "shaped links",
                     "description": "The bottleneck links carried {{ $value | humanize1024 }}B/s, under half of "
                                    "what one rank hands to collectives: the collectives take another path, so the "
                                    "run's times are not those of the shaped network."}},
    {"alert": "TestbedExporterDown",
     "expr": 'up{exporter=~".+"} == 0',
     "for": "30s", "labels": {"severity": "warning"},
     "annotations": {"summary": "testbed's {{ $labels.exporter }} exporter at {{ $labels.instance }} is down",
                     "description": "Prometheus cannot scrape it: its testbed or run lost its metrics "
                                    "(`testbed monitor status` shows the last error)."}},
    {"alert": "TestbedLinkCountersUnreadable",
     "expr": "testbed_link_scrape_ok == 0",
     "for": "1m", "labels": {"severity": "warning"},
     "annotations": {"summary": "The link exporter cannot read testbed {{ $labels.testbed }}'s tc counters",
                     "description": "`testbed status {{ $labels.testbed }}` and `testbed doctor` say why."}},
    {"alert": "TestbedRunStalledOnSaturatedLink",
     "expr": 'max by (testbed) (testbed:link_utilisation:ratio_rate1m{bottleneck="true"}) > 0.95'
             " and on(testbed) (max by (testbed) (testbed:run_iterations:rate1m) == 0)",
     "for": "2m", "labels": {"severity": "warning"},
     "annotations": {"summary": "A run on testbed {{ $labels.testbed }} makes no progress while a bottleneck is "
                                "full",
                     "description": "A bottleneck link is over 95% utilised and no iteration has completed for "
                                    "a minute: cross-traffic or the shape leaves the run no room."}},
]


def rules() -> dict:
    return {"groups": [{"name": "testbed.recording", "rules": RECORDING},
                       {"name": "testbed.alerts", "rules": ALERTS}]}


def render() -> str:
    return ("# generated from testbed/monitor/rules.py (python -m testbed.monitor.rules --write); do not edit\n"
            + yaml.safe_dump(rules(), sort_keys=False, width=120))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m testbed.monitor.rules", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--write", action="store_true", help=f"write {COMPOSE_RULES} (else print the rules)")
    args = p.parse_args(argv)
    if args.write:
        COMPOSE_RULES.parent.mkdir(parents=True, exist_ok=True)
        COMPOSE_RULES.write_text(render())
        print(COMPOSE_RULES)
    else:
        print(render(), end="")


if __name__ == "__main__":
    main()
