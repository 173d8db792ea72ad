"""A new backend, link kind or scheme is one module plus a registration line: registering a
toy one (and nothing else) makes the loader, the planner, doctor and the workload accept it.
docs/architecture.md lists the files each touches; these tests are its check."""

from __future__ import annotations

import ipaddress

from testbed import load_topology_dict
from testbed.engine import doctor
from testbed.engine.planner import make_plan
from testbed.model import backend_options
from testbed.nodes import BACKENDS
from testbed.nodes.base import Check
from testbed.nodes.netns import NetnsBackend
from testbed.plan import links
from testbed.plan.actions import CreateNetns

NET = ipaddress.ip_network("10.9.0.0/24")


def _topology(backend: str = "netns") -> dict:
    return {"name": "ext", "nodes": {"s0": {"kind": "switch"}, "w0": {"kind": "worker", "backend": backend},
                                     "w1": {"kind": "worker"}},
            "links": [{"endpoints": ["w0", "s0"]}, {"endpoints": ["w1", "s0"]}]}


class Toy(NetnsBackend):
    name = "toy"

    def plan_node(self, testbed, node, ns, tag, address, sysctls):
        return [CreateNetns(ns, "toy:" + tag)]

    def checks(self):
        return [Check("toy engine", True, "a toy answers")]


def test_a_backend_is_its_module_plus_a_registration(monkeypatch):
    monkeypatch.setitem(BACKENDS, "toy", Toy())  # testbed/nodes/__init__.py: the registry
    monkeypatch.setitem(backend_options.OPTIONS, "toy", type("ToyOptions", (backend_options.Options,),
                                                             {"name": "toy"})())  # its topology keys (none)
    plan = make_plan(load_topology_dict(_topology("toy")), NET)
    toy_made = [a.ns for a in plan.actions if isinstance(a, CreateNetns) and a.tag.startswith("toy:")]
    assert toy_made == [plan.nodes["w0"].netns]  # w0 made by the toy, w1 by netns
    monkeypatch.setattr(doctor, "_cap_net_admin", lambda: False)
    monkeypatch.setattr(doctor.os, "geteuid", lambda: 1000)  # no kernel probe: only the registries speak
    assert "toy engine" in [c.name for c in doctor.run_checks()]


def test_an_unregistered_backend_is_refused_naming_the_registered_ones():
    import pytest

    from testbed.common.errors import TopologyError

    with pytest.raises(TopologyError) as e:
        load_topology_dict(_topology("toy"))
    assert "netns" in e.value.hint and "docker" in e.value.hint


def test_a_link_kind_is_its_class_plus_its_place_in_the_registry(monkeypatch):
    made = []

    class Loop(links.Veth):
        name = "loop"

        def joins(self, a, b):
            return True

        def plan(self, ctx, link, a, b):
            made.append(link.name)
            return super().plan(ctx, link, a, b)

    monkeypatch.setattr(links, "LINK_KINDS", [Loop(), *links.LINK_KINDS])
    make_plan(load_topology_dict(_topology()), NET)
    assert len(made) == 2


def test_a_scheme_is_its_module_plus_a_registration(monkeypatch):
    from workloads import schemes
    from workloads.arguments import parse_args

    monkeypatch.setitem(schemes.SCHEMES, "toy", schemes.Scheme("toy", "a toy: DDP's all-reduce", "allreduce"))
    scheme, values = schemes.parse_variant("toy")
    assert scheme.name == "toy" and values == {}
    assert parse_args(["--scheme", "toy"]).scheme == "toy"
    assert "toy" in schemes.names()
