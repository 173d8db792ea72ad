"""Multi-host logic without machines: hosts: and placement, the plan's shares and tunnels,
remote command lines. (tests/kernel/test_multihost.py runs it across real sshd hosts.)"""

from __future__ import annotations

import ipaddress
import shlex

import pytest

from testbed.hosts import share
from testbed.plan import actions
from testbed.common.errors import StateError, TopologyError
from testbed.engine.planner import make_plan
from testbed.plan.plan import vni_base
from testbed.hosts.ssh.client import remote_line
from testbed.model.topology import load_topology_dict


def _topo(**over) -> dict:
    t = {
        "name": "mh",
        "hosts": [{"name": "h1", "address": "192.0.2.11"}, {"name": "h2", "address": "gpu2.example.org",
                                                            "underlay": "192.0.2.12", "port": 2222}],
        "nodes": {"s0": {"kind": "switch"}, "s1": {"kind": "switch", "host": "h1"},
                  "s2": {"kind": "switch", "host": "h2"}, "w0": {"kind": "worker"},
                  "w1": {"kind": "worker"}, "w2": {"kind": "worker", "host": "h2"}},
        "links": [{"endpoints": ["w0", "s0"]}, {"endpoints": ["w1", "s1"]}, {"endpoints": ["w2", "s2"]},
                  {"endpoints": ["s1", "s0"], "rate": "100mbit"}, {"endpoints": ["s2", "s1"]}],
    }
    t.update(over)
    return t


def test_workers_follow_their_switch_unless_placed():
    t = load_topology_dict(_topo())
    assert {n.name: n.host for n in t.nodes} == {"s0": "local", "s1": "h1", "s2": "h2", "w0": "local",
                                                 "w1": "h1", "w2": "h2"}
    assert t.multi_host and t.data_mtu == 1450
    assert t.host("h2").underlay == "192.0.2.12" and t.host("h1").underlay == "192.0.2.11"
    assert load_topology_dict(t.to_dict()) == t


def test_one_host_keeps_mtu_1500_and_vxlan_mtu_overrides():
    single = _topo(hosts=None)
    del single["hosts"]
    for n in single["nodes"].values():
        n.pop("host", None)
    t = load_topology_dict(single)
    assert not t.multi_host and t.data_mtu == 1500
    assert load_topology_dict(_topo(vxlan={"mtu": 8950, "port": 14789})).data_mtu == 8950


@pytest.mark.parametrize("change, path, words", [
    (lambda t: t["nodes"]["s1"].update(host="h9"), "nodes.s1.host", "unknown host 'h9'"),
    (lambda t: t["hosts"].append({"name": "h1", "address": "192.0.2.13"}), "hosts[2].name", "defined twice"),
    (lambda t: t["hosts"].append({"name": "local", "address": "192.0.2.13"}), "hosts[2].name", "needs no entry"),
    (lambda t: t["hosts"][1].pop("underlay"), "hosts[1].underlay", "tunnels need"),
    (lambda t: t["hosts"][0].update(address="bad host;rm"), "hosts[0].address", "neither"),
    (lambda t: t["hosts"][0].update(port=0), "hosts[0].port", "1..65535"),
    (lambda t: t["hosts"][0].update(user="root; id"), "hosts[0].user", "invalid user"),
    (lambda t: t["hosts"][0].update(testbed="testbed $(id)"), "hosts[0].testbed", "invalid program"),
    (lambda t: t["hosts"][0].update(accept_new_host_key="yes"), "hosts[0].accept_new_host_key", "true or false"),
    (lambda t: t["hosts"][0].update(password="x"), "hosts[0].password", "unknown key"),
    (lambda t: t["hosts"].append({"name": "h3", "address": "192.0.2.14"}), "hosts", "carry no node"),
    (lambda t: t["hosts"][1].update(underlay="192.0.2.11"), "hosts", "same underlay"),
    (lambda t: t.update(vxlan={"mtu": 100}), "vxlan.mtu", "1280..9000"),
    (lambda t: t.update(vxlan={"port": 70000}), "vxlan.port", "1..65535"),
    (lambda t: t["nodes"]["w2"].update(backend="vm"), "nodes.w2.backend", "multi-host topology yet"),
])
def test_bad_hosts_name_the_field(change, path, words):
    t = _topo()
    change(t)
    with pytest.raises(TopologyError) as e:
        load_topology_dict(t)
    assert e.value.path == path and words in e.value.message, e.value


def test_the_plan_splits_into_shares_with_a_tunnel_per_cross_host_link():
    t = load_topology_dict(_topo())
    under = {"local": "192.0.2.1", "h1": "192.0.2.11", "h2": "192.0.2.12"}
    plan = make_plan(t, ipaddress.ip_network("10.9.0.0/24"), under)
    assert plan.hosts == ["local", "h1", "h2"]
    assert sum(len(plan.share(h)) for h in plan.hosts) == len(plan.actions)
    # each host with a switch has its own fabric namespace; nodes are made where they are placed
    for h, nss in (("local", ["mh", "mh.w0"]), ("h1", ["mh", "mh.w1"]), ("h2", ["mh", "mh.w2"])):
        assert plan.namespaces_on(h) == nss
    # links 3 (s1-s0: h1/local) and 4 (s2-s1: h2/h1) are tunnels, one VNI each, ends mirrored
    tunnels = {}
    for h in plan.hosts:
        for a in plan.share(h):
            if isinstance(a, actions.CreateVxlan):
                tunnels.setdefault(a.link, {})[h] = a
    assert set(tunnels) == {3, 4}
    for link, ends in tunnels.items():
        (ha, a), (hb, b) = ends.items()
        assert a.vni == b.vni == vni_base("mh") + link
        assert (a.local, a.remote) == (under[ha], under[hb]) and (b.local, b.remote) == (under[hb], under[ha])
        assert a.mtu == b.mtu == 1450 and a.port == 4789 and a.master and b.master
    # same-host links stay veth, with the tunnel's MTU (one L2 domain, one MTU)
    veths = [a for a in plan.actions if isinstance(a, actions.CreateVeth)]
    assert len(veths) == 3 and all(v.mtu == 1450 for v in veths)
    # each direction is shaped on the host where it leaves
    assert plan.egress[(3, "forward")].host == "h1" and plan.egress[(3, "reverse")].host == "local"
    shaped = {(a.link, a.direction): h for h in plan.hosts for a in plan.share(h) if isinstance(a, actions.ShapeEgress)}
    assert shaped[(3, "forward")] == "h1" and shaped[(3, "reverse")] == "local"


def test_a_cross_host_link_without_tunnel_addresses_is_refused():
    t = load_topology_dict(_topo())
    with pytest.raises(TopologyError, match="tunnel addresses"):
        make_plan(t, ipaddress.ip_network("10.9.0.0/24"), None)


def test_remote_command_lines_quote_every_word():
    argv = ["testbed", "_host", "exec", "mh", "w0", "--", "sh", "-c", "echo $(id); rm -rf / #", "a'b", ""]
    line = remote_line(argv)
    assert line.startswith("exec ")
    assert shlex.split(line) == ["exec", *argv]


def test_remote_share_round_trips_through_the_ledger():
    h = load_topology_dict(_topo()).host("h2")
    a = share.RemoteShare.of(h)
    assert actions.from_dict(a.to_dict()) == a and a.host_spec() == h
    bad = share.RemoteShare("h2", a.spec.replace("gpu2.example.org", "x;rm -rf /"))
    with pytest.raises(StateError, match="bad host spec"):
        bad.host_spec()
    v = actions.CreateVxlan("mh", "l3a", 4096, "192.0.2.1", "192.0.2.11", 4789, 1450, "sw0", 3)
    assert actions.from_dict(v.to_dict()) == v
