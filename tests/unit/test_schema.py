"""topologies/schema.json is what the generator makes of the loader's definitions, and the
registries the loader and the planner read hold the same names."""

from __future__ import annotations

from pathlib import Path

from testbed.model import schema
from testbed.model.backend_options import OPTIONS
from testbed.model.link_types import LINK_TYPES
from testbed.plan.links import LINK_KINDS

SCHEMA = Path(__file__).resolve().parents[2] / "testbed" / "topologies" / "schema.json"


def test_the_committed_schema_is_the_generated_one():
    assert SCHEMA.read_text() == schema.render(), \
        "testbed/topologies/schema.json is stale: python -m testbed.model.schema > testbed/topologies/schema.json"


def test_the_schema_lists_every_registered_backend_and_link_type():
    s = schema.build()
    assert s["properties"]["defaults"]["properties"]["backend"]["enum"] == list(OPTIONS)
    assert s["properties"]["links"]["items"]["properties"]["type"]["enum"] == list(LINK_TYPES)


def test_the_loader_and_the_planner_know_the_same_link_types_and_backends():
    from testbed import nodes

    assert list(LINK_KINDS) == list(LINK_TYPES)
    assert all(LINK_KINDS[n].keys == LINK_TYPES[n].keys for n in LINK_KINDS)
    assert list(nodes.names()) == list(OPTIONS)
