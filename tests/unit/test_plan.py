import ipaddress

import pytest

from testbed.plan import naming
from testbed.common.errors import TopologyError
from testbed.engine.planner import make_plan
from testbed.plan.actions import AddAddress, CreateNetns, CreateVeth, ShapeEgress
from testbed.plan.plan import Endpoint, choose_subnet
from testbed.nodes.cgroup import CreateCgroup
from testbed.model.topology import load_topology_dict
from tests.helpers import dumbbell, star, star_of_stars


def test_a_switch_holds_at_most_1023_ports():
    with pytest.raises(TopologyError, match="at most 1023 ports") as ei:
        load_topology_dict(star(1024))
    assert ei.value.path == "nodes.s0"
    assert len(load_topology_dict(star(1023)).workers) == 1023


@pytest.mark.slow  # the quick pass under 2 minutes; the suite runs it
def test_kernel_names_fit_at_1024_workers_with_long_user_names():
    t = load_topology_dict(star(1023, name="x" * 32, prefix="worker-with-a-very-long-name-" + "y" * 25))
    plan = make_plan(t, ipaddress.ip_network("10.50.0.0/16"))
    ifnames = set()
    for a in plan.actions:
        for attr in ("ifname", "peer_ifname", "master", "peer_master"):
            v = getattr(a, attr, None)
            if v:
                assert len(v) <= naming.IFNAMSIZ, v
                ifnames.add((a.ns, v) if attr != "peer_ifname" else (a.peer_ns, v))
    assert len(plan.namespaces) == 1024
    assert len(set(plan.namespaces)) == 1024
    addrs = [n.address for n in plan.nodes.values() if n.address]
    assert len(set(addrs)) == 1023


def test_every_direction_is_shaped_on_its_own_egress():
    t = load_topology_dict(dumbbell(rate="100mbit"))
    plan = make_plan(t, ipaddress.ip_network("10.9.0.0/24"))
    shapes = [a for a in plan.actions if isinstance(a, ShapeEgress)]
    assert len(shapes) == 2 * len(t.links)
    keys = {(s.ns, s.ifname) for s in shapes}
    assert len(keys) == len(shapes), "each interface carries one direction"
    bn = [s for s in shapes if s.link == 2]
    assert {s.direction for s in bn} == {"forward", "reverse"}
    assert all(s.shape.rate.bps == 10**8 for s in bn)
    # forward (s0 -> s1) leaves s0's end of the veth, reverse leaves s1's end
    assert (plan.egress[(2, "forward")].ifname, plan.egress[(2, "reverse")].ifname) == ("l2a", "l2b")
    assert plan.egress[(0, "forward")] == Endpoint("db.w0", "eth0")  # w0 -> s0 leaves the worker


def test_objects_are_created_after_their_namespaces():
    t = load_topology_dict(star(5))
    plan = make_plan(t, ipaddress.ip_network("10.9.0.0/24"))
    made = set()
    for a in plan.actions:
        if isinstance(a, CreateNetns):
            made.add(a.ns)
        elif isinstance(a, CreateCgroup):  # the testbed's, in no namespace: made once the nodes are
            assert a is plan.actions[-1] and a.testbed == "star"
        else:
            assert a.ns in made
            if isinstance(a, CreateVeth):
                assert a.peer_ns in made
    assert sum(isinstance(a, AddAddress) for a in plan.actions) == 5


def test_rank_order_is_topology_order():
    t = load_topology_dict(star(4))
    plan = make_plan(t, ipaddress.ip_network("10.9.0.0/24"))
    assert [plan.nodes[f"w{i}"].rank for i in range(4)] == [0, 1, 2, 3]
    assert plan.nodes["w0"].address == "10.9.0.1"


def test_subnet_choice_avoids_host_routes():
    t = load_topology_dict(star(2))
    routes = [ipaddress.ip_network("10.200.0.0/16"), ipaddress.ip_network("10.201.3.0/24")]
    assert choose_subnet(t, routes) == ipaddress.ip_network("10.202.0.0/16")
    d = star(2)
    d["subnet"] = "10.201.0.0/16"
    with pytest.raises(TopologyError, match="overlaps the host route 10.201.3.0/24") as ei:
        choose_subnet(load_topology_dict(d), routes)
    assert ei.value.path == "subnet"
    # the default route does not count
    assert choose_subnet(t, [ipaddress.ip_network("0.0.0.0/0")]) == ipaddress.ip_network("10.200.0.0/16")


def test_pinned_interface_indexes_are_unique_and_clear_of_automatic_ones():
    from testbed.plan.plan import PINNED_INDEX_BASE

    t = load_topology_dict(dumbbell())
    plan = make_plan(t, ipaddress.ip_network("10.9.0.0/24"))
    pinned = [(a.ns, a.index) for a in plan.actions if getattr(a, "index", None) is not None]
    assert len(pinned) == len(set(pinned)) == 2 + 3  # two bridges, three locally created veth ends
    assert all(idx >= PINNED_INDEX_BASE for _, idx in pinned)


def test_star_of_stars_1024():
    t = load_topology_dict(star_of_stars(1024))
    assert len(t.workers) == 1024 and len(t.switches) == 3
