"""Actions and the node interface, without root: mixed plans, ledger round-trips."""

from __future__ import annotations

import dataclasses
import ipaddress
import json

import pytest

from testbed.hosts import share
from testbed.plan import actions
from testbed.nodes import BACKENDS
from testbed.nodes.docker.backend import DEFAULT_IMAGE, StartContainer
from testbed.common.errors import StateError, TopologyError
from testbed.engine.planner import make_plan
from testbed.model.topology import load_topology_dict
from tests.helpers import dumbbell

SUBNET = ipaddress.ip_network("10.77.0.0/24")


def _mixed(**w1) -> dict:
    d = dumbbell("mix")
    d["nodes"]["w1"].update(backend="docker", **w1)
    return d


def test_a_mixed_plan_makes_each_worker_with_its_backend_and_wires_both_alike():
    plan = make_plan(load_topology_dict(_mixed(cpus=2, env={"A": "1"})), SUBNET)
    made = {a.ns: a for a in plan.actions if a.creates_namespace}
    assert type(made["mix.w0"]) is actions.CreateNetns
    c = made["mix.w1"]
    assert type(c) is StartContainer
    assert (c.container, c.node, c.testbed, c.image, c.cpus, c.env, c.shm_size) == \
        ("testbed-mix.w1", "w1", "mix", DEFAULT_IMAGE, 2.0, ("A=1",), "1g")
    assert plan.namespaces == ["mix", "mix.w0", "mix.w1"]
    # every later step reaches the container through its named namespace, as for netns
    veths = [a for a in plan.actions if isinstance(a, actions.CreateVeth)]
    assert {(v.peer_ns, v.peer_ifname) for v in veths if v.peer_ns != "mix"} == {("mix.w0", "eth0"), ("mix.w1", "eth0")}
    shaped = {(a.ns, a.ifname) for a in plan.actions if isinstance(a, actions.ShapeEgress)}
    assert ("mix.w1", "eth0") in shaped and ("mix.w0", "eth0") in shaped
    # the container exists before anything is put into its namespace
    order = [a.ns if a.creates_namespace else None for a in plan.actions]
    first_use = next(i for i, a in enumerate(plan.actions) if getattr(a, "peer_ns", None) == "mix.w1")
    assert order.index("mix.w1") < first_use
    assert plan.nodes["w1"].backend == "docker" and plan.nodes["w1"].netns == "mix.w1"


def test_every_registered_action_round_trips_through_the_ledger():
    d = _mixed(volumes=["/data:/data:ro"], memory="2g")
    d["defaults"] = {"sysctls": {"net.ipv4.tcp_congestion_control": "reno"}}
    plan = make_plan(load_topology_dict(d), SUBNET)
    samples = {type(a).__name__: a for a in plan.actions}
    samples["StartExporter"] = actions.StartExporter("--sd-file=/x/t.json", "/x/t.json", "127.0.0.1:0", "/x/log")
    samples["TargetFile"] = actions.TargetFile("/x/run.json")
    samples["StartReplay"] = actions.StartReplay("--replay-id=" + "ab" * 16, "/x/replay.jsonl")
    samples["StartTraffic"] = actions.StartTraffic("--logfile=/runs/r1/traffic-0-server.log")
    from testbed.nodes.vm.backend import AwaitVMs, CreateVmNic, StartVM

    samples["CreateVmNic"] = CreateVmNic("mix.w2")
    samples["StartVM"] = StartVM("mix.w2", "w2", "/run/testbed/vm/mix.w2", "10.77.0.3/24", "/k/vmlinuz", "/k/initrd",
                                 "auto", 2, "4g", ("net.core.somaxconn=512",), "0000:65:00.0", "/usr/bin/python3")
    samples["AwaitVMs"] = AwaitVMs(("mix.w2", "/run/testbed/vm/mix.w2"))
    samples["CreateVxlan"] = actions.CreateVxlan("mix", "l3a", 4096, "192.0.2.1", "192.0.2.11", 4789, 1450, "sw0", 3)
    samples["RemoteShare"] = share.RemoteShare("h1", '{"address": "gpu1.example.org", "name": "h1", '
                                                 '"underlay": "192.0.2.11", "port": 2222}')
    samples["AwaitShares"] = share.AwaitShares()
    from testbed.plan.tunnel_action import StartTunnel

    samples["StartTunnel"] = StartTunnel("--tunnel-id=" + "cd" * 16, "mix", "t3a", "192.0.2.1", 30003, "192.0.2.11",
                                         30003, "ef" * 16, 3)
    assert set(samples) == set(actions.registered()), "a registered action has no sample here"
    for a in samples.values():
        line = json.dumps(a.to_dict())  # what the ledger holds
        assert actions.from_dict(json.loads(line)) == a


@pytest.mark.parametrize("entry, words", [
    ({"action": "RmRf", "path": "/"}, "unknown action"),
    ({"ns": "x"}, "names no action"),
    ({"action": "CreateNetns", "ns": "a", "tag": "t", "evil": 1}, "unknown field"),
    ({"action": "CreateNetns", "ns": {"$": 1}, "tag": "t"}, "not a plain value"),
    ({"action": "CreateNetns", "ns": "a"}, "tag"),
    ({"action": "ShapeEgress", "ns": "a", "ifname": "e", "link": 0, "direction": "forward",
      "shape": {"rate": "fast"}}, "bad shape"),
    ({"action": "TargetFile", "target": [1]}, "field 'target' should be str, got tuple"),
    ({"action": "CreateNetns", "ns": 5, "tag": "t"}, "field 'ns' should be str, got int"),
    ({"action": "CreateVxlan", "ns": "mix", "ifname": "l3a", "vni": True, "local": "192.0.2.1",
      "remote": "192.0.2.11", "port": 4789, "mtu": 1450}, "field 'vni' should be int, got bool"),
])
def test_untrusted_ledger_entries_are_refused_with_the_reason(entry, words):
    with pytest.raises(StateError) as e:
        actions.from_dict(entry)
    assert words in str(e.value)


def test_backend_keys_are_validated_by_the_backend_and_round_trip():
    t = load_topology_dict(_mixed(image="my/img:1", shm_size="2g", env={"X": 3}))
    assert load_topology_dict(t.to_dict()) == t
    for bad, path in ((dict(cpus=0), "nodes.w1.cpus"), (dict(memory="lots"), "nodes.w1.memory"),
                      (dict(image="UPPER case"), "nodes.w1.image"), (dict(env={"1x": "a"}), "nodes.w1.env"),
                      (dict(volumes=["rel:/x"]), "nodes.w1.volumes[0]")):
        with pytest.raises(TopologyError) as e:
            load_topology_dict(_mixed(**bad))
        assert e.value.path == path, e.value
    d = dumbbell("nd")
    d["nodes"]["w0"]["image"] = "x"
    with pytest.raises(TopologyError, match="does not apply to backend netns"):
        load_topology_dict(d)
    d = dumbbell("dd")
    d["defaults"] = {"backend": "docker", "cpus": 1}
    assert all(dict(w.options)["cpus"] == 1.0 for w in load_topology_dict(d).workers)
    d["defaults"]["backend"] = "vmware"
    with pytest.raises(TopologyError) as e:
        load_topology_dict(d)
    assert "choose one of: " + ", ".join(BACKENDS) in str(e.value)


def test_every_action_is_a_frozen_dataclass_with_plain_fields():
    for name, cls in actions.registered().items():
        assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen, name


def test_teardown_leaves_alone_what_a_tampered_ledger_names(tmp_path, monkeypatch):
    """Entries naming another testbed's namespace, or files outside the target directory,
    are reported and nothing is touched (no root needed: nothing here reaches the kernel)."""
    from testbed.plan.ledger import Ledger
    from testbed.engine.teardown import teardown

    monkeypatch.setenv("TESTBED_STATE_DIR", str(tmp_path / "state"))
    victim = tmp_path / "precious.json"
    victim.write_text("keep me")
    led = Ledger("tb")
    led.create()
    led.record(actions.CreateNetns("other.w0", "testbed:tb").to_dict(),
               actions.TargetFile(str(victim)).to_dict(),
               actions.StartExporter("--config=/etc/x", str(tmp_path / "state" / "targets" / "testbed-tb.json")).to_dict(),
               {"action": "Nope"})
    led.close()
    problems = teardown("tb")
    assert any("'other.w0'" in p and "cannot have made" in p for p in problems), problems
    assert any("precious.json" in p and "left alone" in p for p in problems), problems
    assert any("marker" in p for p in problems) and any("unknown action" in p for p in problems), problems
    assert victim.read_text() == "keep me"
    assert led.exists(), "a ledger with problems is kept for another try"


def test_a_damaged_ledger_line_does_not_hide_the_entries_after_it(tmp_path, monkeypatch):
    from testbed.plan.ledger import Ledger

    monkeypatch.setenv("TESTBED_STATE_DIR", str(tmp_path / "state"))
    led = Ledger("tb")
    led.create()
    led.record(actions.CreateNetns("tb.w0", "testbed:tb").to_dict())
    with open(led.path, "a") as f:
        f.write('{"action": "CreateNe\x00garbage\n')
    led.record(actions.CreateNetns("tb.w1", "testbed:tb").to_dict())
    with open(led.path, "a") as f:  # lines JSON cannot read, or that are no entry
        f.write("[" * 100_000 + "]" * 100_000 + "\n" + "1" * 5000 + "\n" + "[1, 2]\n")
    led.record(actions.CreateNetns("tb.w3", "testbed:tb").to_dict())
    with open(led.path, "a") as f:
        f.write('{"action": "CreateNetns", "ns": "tb.w2"')  # torn by a crash: never ran
    damaged: list[str] = []
    got = [e["ns"] for e in led.entries(damaged)]
    assert got == ["tb.w0", "tb.w1", "tb.w3"]
    assert [d.split(" is ")[0] for d in damaged] == ["ledger line 2", "ledger line 4", "ledger line 5",
                                                     "ledger line 6"], damaged


def test_ownership_tags_name_the_state_directory():
    from testbed.plan import naming

    mine, other = naming.state_id("/srv/a"), naming.state_id("/srv/b")
    t = naming.tag("tb", mine)
    assert t == f"testbed:tb@{mine}" and mine != other
    assert naming.testbed_of_tag(t, mine) == "tb"
    assert naming.testbed_of_tag(t, other) is None  # another state directory's testbed
    assert naming.testbed_of_tag("something else", mine) is None
    # a tag from before state ids: the default state directory's
    assert naming.testbed_of_tag("testbed:old", naming.state_id(naming.DEFAULT_STATE)) == "old"
    assert naming.testbed_of_tag("testbed:old", mine) is None
    # who owns a tag, whoever asks (the kernel tests' lanes tell their state directories apart)
    assert naming.owner_of_tag(t) == ("tb", mine)
    assert naming.owner_of_tag("testbed:old") == ("old", naming.state_id(naming.DEFAULT_STATE))
    assert naming.owner_of_tag("something else") is None and naming.owner_of_tag(None) is None


def test_state_directories_are_private_and_never_a_symlink(tmp_path, monkeypatch):
    import os
    import stat as st

    from testbed.plan.ledger import Ledger

    monkeypatch.setenv("TESTBED_STATE_DIR", str(tmp_path / "state"))
    led = Ledger("tb")
    led.create()
    led.close()
    for d in (tmp_path / "state", tmp_path / "state" / "tb"):
        assert st.S_IMODE(os.stat(d).st_mode) == 0o700, d
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "state" / "ln").symlink_to(elsewhere)
    with pytest.raises(StateError, match="not a directory"):
        Ledger("ln").write_state({})
    assert list(elsewhere.iterdir()) == []


@pytest.mark.parametrize("action, words", [
    (actions.StartReplay("--sd-file=/x/t.json", "/x/log"), "is not --replay-id="),
    (actions.StartReplay("--replay-id=abc", "/x/log"), "is not --replay-id="),
    (actions.StartTraffic("--logfile=/etc/passwd"), "is not --logfile=<run dir>/traffic-N-ROLE.log"),
    (actions.StartTraffic("--replay-id=" + "ab" * 16), "is not --logfile="),
])
def test_a_forged_process_marker_in_the_ledger_kills_nothing(action, words):
    """A ledger entry names the argument that finds its process; one that could match a
    process testbed did not start is refused before anything is signalled."""
    from testbed.common.errors import TestbedError

    td = actions.Teardown("t", set(), host=object())
    with pytest.raises(TestbedError, match=words):
        action.release(td)
