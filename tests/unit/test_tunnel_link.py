"""Links between hosts as user-space tunnels (issue 42 item 3): which type a link across
hosts gets (``vxlan`` as root, ``tunnel`` in an ordinary user's rootless namespaces), what
the planner makes of a tunnel link, its ports and token, and the rootless checks."""

from __future__ import annotations

import ipaddress

import pytest

from testbed.common import rootless
from testbed.common.errors import TestbedError, TopologyError
from testbed.engine import planner, preflight
from testbed.model.topology import load_topology_dict
from testbed.plan.actions import CreateVeth, from_dict
from testbed.plan.tunnel_action import GSO_MAX_SIZE, StartTunnel

UNDER = {"local": "198.19.0.1", "h2": "198.19.0.12"}


def _doc(link_type: str | None = None, **top) -> dict:
    cross = {"endpoints": ["s1", "s2"], "rate": "100mbit", **({"type": link_type} if link_type else {})}
    return {"name": "tl", "hosts": [{"name": "h2", "address": "198.19.0.12"}],
            "nodes": {"s1": {"kind": "switch"}, "s2": {"kind": "switch", "host": "h2"},
                      "w0": {"kind": "worker"}, "w1": {"kind": "worker"}},
            "links": [{"endpoints": ["w0", "s1"]}, {"endpoints": ["w1", "s2"]}, cross], **top}


@pytest.fixture
def as_user(monkeypatch):
    monkeypatch.setattr(rootless, "active", lambda: True)


def test_across_hosts_root_gets_vxlan_and_a_user_a_tunnel(as_user, monkeypatch):
    assert [l.type for l in load_topology_dict(_doc()).links] == ["veth", "veth", "tunnel"]
    monkeypatch.setattr(rootless, "active", lambda: False)
    assert [l.type for l in load_topology_dict(_doc()).links] == ["veth", "veth", "vxlan"]
    assert load_topology_dict(_doc("tunnel")).links[2].type == "tunnel"  # root may ask for one
    with pytest.raises(TopologyError) as e:
        load_topology_dict({**_doc(), "links": [{"endpoints": ["w0", "s1"], "type": "tunnel"},
                                                {"endpoints": ["w1", "s2"]}, {"endpoints": ["s1", "s2"]}]})
    assert "cannot join ends on one host" in e.value.message


def _tunnel_actions(topo):
    plan = planner.make_plan(topo, ipaddress.ip_network("10.9.0.0/24"), UNDER)
    return {h: [a for a in plan.share(h) if isinstance(a, (StartTunnel, CreateVeth)) and a.link == 2]
            for h in ("local", "h2")}


def test_a_tunnel_link_is_a_veth_pair_and_a_forwarder_at_each_end_with_one_token_and_port():
    topo = load_topology_dict(_doc("tunnel"))
    got = _tunnel_actions(topo)
    port = planner.tunnel_port(topo) + 2
    ends = {}
    for host, other, side in (("local", "h2", "a"), ("h2", "local", "b")):
        veth, fwd = got[host]
        assert isinstance(veth, CreateVeth) and isinstance(fwd, StartTunnel)
        assert (veth.ifname, veth.peer_ifname, veth.ns, veth.peer_ns) == (f"l2{side}", f"t2{side}", "tl", "tl")
        assert veth.master == f"sw{0 if side == 'a' else 1}" and veth.peer_up and veth.gso_max_size == GSO_MAX_SIZE
        assert (fwd.ns, fwd.ifname, fwd.local, fwd.port, fwd.remote, fwd.peer_port) == \
            ("tl", f"t2{side}", UNDER[host], port, UNDER[other], port)
        assert fwd.valid() and fwd.token not in fwd.describe()
        assert from_dict(fwd.to_dict()) == fwd  # the ledger reads it back
        ends[side] = fwd
    assert ends["a"].token == ends["b"].token and len(bytes.fromhex(ends["a"].token)) == 16
    assert ends["a"].marker != ends["b"].marker
    assert _tunnel_actions(topo)["local"][1].token != ends["a"].token  # a new token for each plan
    plan = planner.make_plan(topo, ipaddress.ip_network("10.9.0.0/24"), UNDER)  # every veth: frames cross whole
    assert {a.gso_max_size for a in plan.actions if isinstance(a, CreateVeth)} == {GSO_MAX_SIZE}
    plan = planner.make_plan(load_topology_dict(_doc("vxlan")), ipaddress.ip_network("10.9.0.0/24"), UNDER)
    assert {a.gso_max_size for a in plan.actions if isinstance(a, CreateVeth)} == {None}


def test_tunnel_ports_derive_from_the_name_and_uid_or_from_the_topology():
    a, b = load_topology_dict(_doc("tunnel")), load_topology_dict({**_doc("tunnel"), "name": "tl2"})
    low, high = planner.TUNNEL_PORTS
    assert low <= planner.tunnel_port(a) < high and planner.tunnel_port(a) == planner.tunnel_port(a)
    assert planner.tunnel_port(a) != planner.tunnel_port(b)
    fixed = load_topology_dict(_doc("tunnel", tunnel={"port": 30000}))
    assert planner.tunnel_port(fixed) == 30000
    assert load_topology_dict(fixed.to_dict()) == fixed
    assert _tunnel_actions(fixed)["h2"][1].port == 30002
    top = load_topology_dict(_doc("tunnel", tunnel={"port": 65534}))
    with pytest.raises(TopologyError) as e:
        _tunnel_actions(top)
    assert e.value.path == "tunnel.port" and "65536" in e.value.message


@pytest.mark.parametrize("value", [{"port": 80}, {"port": 70000}, {"port": "1"}, {"port": True}, {"prt": 3},
                                   "30000"])
def test_a_bad_tunnel_setting_is_one_error_naming_it(value):
    with pytest.raises(TopologyError) as e:
        load_topology_dict(_doc("tunnel", tunnel=value))
    assert e.value.path.startswith("tunnel")


def test_rootless_refuses_a_written_vxlan_and_takes_tunnels(as_user, monkeypatch):
    preflight.check_rootless(load_topology_dict(_doc()))  # the automatic choice: a tunnel
    monkeypatch.setattr(rootless, "active", lambda: False)
    vx = load_topology_dict(_doc("vxlan"))
    monkeypatch.setattr(rootless, "active", lambda: True)
    with pytest.raises(TestbedError) as e:
        preflight.check_rootless(vx)
    assert "type vxlan, which needs root" in e.value.message and "type: tunnel" in (e.value.hint or "")


def test_a_tunnel_marker_not_of_our_form_is_refused_before_any_signal():
    bad = StartTunnel("--sd-file=/etc/passwd", "tl", "t2a", "1.2.3.4", 30000, "1.2.3.5", 30000, "00" * 16, 2)
    assert not bad.valid() and bad.pids() == []
