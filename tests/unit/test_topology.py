import copy
import re
from pathlib import Path

import pytest
import yaml

from testbed.common.errors import TopologyError
from testbed.model.topology import load_topology, load_topology_dict
from tests.helpers import dumbbell, star

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted((ROOT / "topologies").glob("*.yaml"))


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_shipped_topologies_load_and_roundtrip(path):
    t = load_topology(path)
    assert t.workers
    assert load_topology_dict(t.to_dict()) == t


def test_a_bare_name_is_a_shipped_topology_and_the_error_lists_them(tmp_path, monkeypatch):
    from testbed.model.topology import SHIPPED_DIR, shipped

    monkeypatch.chdir(tmp_path)  # from any directory, as after a non-editable install
    assert SHIPPED_DIR == ROOT / "testbed" / "topologies"
    assert shipped() == [p.stem for p in SHIPPED] and "three_switch" in shipped()
    assert load_topology("three_switch") == load_topology(ROOT / "topologies" / "three_switch.yaml")
    with pytest.raises(TopologyError) as e:
        load_topology("no_such_topology")
    assert "does not exist" in e.value.message and ", ".join(shipped()) in e.value.hint


def test_three_switch_matches_the_paper():
    t = load_topology(ROOT / "topologies" / "three_switch.yaml")
    assert [w.name for w in t.workers] == [f"w{i}" for i in range(8)]
    bn = [l for l in t.links if l.bottleneck]
    assert {frozenset(l.endpoints) for l in bn} == {frozenset(("s1", "s0")), frozenset(("s2", "s0"))}
    assert all(l.forward.rate.bps == 10**9 == l.reverse.rate.bps for l in bn)
    for i in range(8):
        assert t.worker_link(f"w{i}").b == ("s1" if i < 4 else "s2")


def test_per_direction_shape_overrides_link_shape():
    d = dumbbell(rate="200mbit")
    d["links"][2]["reverse"] = {"rate": "50mbit"}
    t = load_topology_dict(d)
    assert t.links[2].forward.rate.bps == 200 * 10**6
    assert t.links[2].reverse.rate.bps == 50 * 10**6


def test_defaults_apply_to_links_without_shape():
    d = star(3, rate="300mbit")
    t = load_topology_dict(d)
    assert {l.forward.rate.bps for l in t.links} == {300 * 10**6}


def _err(d) -> TopologyError:
    with pytest.raises(TopologyError) as ei:
        load_topology_dict(d)
    return ei.value


def mutate(fn, base=None):
    d = copy.deepcopy(base or dumbbell())
    fn(d)
    return d


@pytest.mark.parametrize("fn,path,words", [
    (lambda d: d.update(colour="red"), "colour", "unknown key"),
    (lambda d: d["nodes"]["w0"].update(colour="x"), "nodes.w0.colour", "unknown key"),
    (lambda d: d["nodes"]["w0"].update(image="x"), "nodes.w0.image", "does not apply to backend netns"),
    (lambda d: d["links"][2].update(bandwidth="1gbit"), "links[2].bandwidth", "unknown key"),
    (lambda d: d.update(defaults={"link": {"rat": "1gbit"}}), "defaults.link.rat", "unknown key"),
    (lambda d: d["links"][2].update(rate="100mbps"), "links[2].rate", "ambiguous"),
    (lambda d: d["links"][2].update(delay="10"), "links[2].delay", "no unit"),
    (lambda d: d["links"][2].update(loss=0.5), "links[2].loss", "percentage"),
    (lambda d: d["links"][2].update(jitter="1ms"), "links[2].jitter", "needs a delay"),
    (lambda d: d["links"][2].update(limit=0), "links[2].limit", "packets"),
    (lambda d: d["links"][2].update(reverse={"rate": "fast"}), "links[2].reverse.rate", "not a rate"),
    (lambda d: d["links"][0].update(endpoints=["w0", "s9"]), "links[0].endpoints[1]", "not defined"),
    (lambda d: d["links"][0].update(endpoints=["w0"]), "links[0].endpoints", "two node names"),
    (lambda d: d["links"].append({"endpoints": ["s1", "s0"]}), "links[3].endpoints", "duplicate link"),
    (lambda d: d["links"].append({"endpoints": ["s0", "s0"]}), "links[3].endpoints", "itself"),
    (lambda d: d["nodes"]["w0"].update(kind="router"), "nodes.w0.kind", "choose one of: worker, switch"),
    (lambda d: d["nodes"]["w0"].update(backend="kvm"), "nodes.w0.backend", "choose one of: netns"),
    (lambda d: d["nodes"]["w0"].update(gpu=-1), "nodes.w0.gpu", "device index"),
    (lambda d: d["nodes"]["w0"].update(gpu=10 ** 30), "nodes.w0.gpu", "device index in 0..1023"),
    (lambda d: d.update(defaults=0), "defaults", "expected a mapping"),
    (lambda d: d.update(defaults=""), "defaults", "expected a mapping"),
    (lambda d: d.update(defaults={"link": []}), "defaults.link", "expected a mapping"),
    (lambda d: d["links"][2].update(forward=[]), "links[2].forward", "expected a mapping"),
    (lambda d: d["nodes"]["w0"].update(sysctls={"kernel.panic": 1}), "nodes.w0.sysctls", "not a network sysctl"),
    (lambda d: d.update(defaults={"sysctls": {"net.ipv4.tcp_congestion_control": "x;reboot"}}),
     "defaults.sysctls.net.ipv4.tcp_congestion_control", "invalid value"),
    (lambda d: d.update(defaults={"sysctls": ["net.ipv4.ip_forward=1"]}), "defaults.sysctls", "expected"),
    (lambda d: d["nodes"]["s0"].update(sysctls={}), "nodes.s0.sysctls", "unknown key"),
    (lambda d: d.update(name="bad name"), "name", "invalid testbed name"),
    (lambda d: d.update(name="x" * 33), "name", "invalid testbed name"),
    (lambda d: d["nodes"].update({"a.b": {"kind": "switch"}}), "nodes.a.b", "invalid node name"),
    (lambda d: d.update(subnet="10.0.0.0/33"), "subnet", "not a network"),
    (lambda d: d.update(subnet="10.0.0.1/24"), "subnet", "not a network"),
    (lambda d: d.update(subnet="10.0.0.0/31"), "subnet", "room for"),
    (lambda d: d.update(subnet="fd00::/64"), "subnet", "IPv4"),
    (lambda d: d.pop("links"), "links", "missing"),
    (lambda d: d.update(links={"a": 1}), "links", "list"),
    (lambda d: d["links"].pop(0), "nodes.w0", "has 0 links"),
    (lambda d: d["links"].append({"endpoints": ["w0", "s1"]}), "nodes.w0", "has 2 links"),
])
def test_errors_name_the_yaml_path(fn, path, words):
    e = _err(mutate(fn))
    assert e.path == path, str(e)
    assert words in str(e)


def test_sysctls_defaults_merge_with_per_worker_values():
    d = dumbbell()
    d["defaults"] = {"sysctls": {"net.ipv4.tcp_congestion_control": "reno", "net.core.somaxconn": 512}}
    d["nodes"]["w1"]["sysctls"] = {"net.ipv4.tcp_congestion_control": "bbr"}
    t = load_topology_dict(d)
    assert dict(t.node("w0").sysctls) == {"net.ipv4.tcp_congestion_control": "reno", "net.core.somaxconn": "512"}
    assert dict(t.node("w1").sysctls)["net.ipv4.tcp_congestion_control"] == "bbr"
    assert load_topology_dict(t.to_dict()) == t


def test_duplicate_link_names_are_refused():
    d = star(2)
    d["nodes"]["s1"] = {"kind": "switch"}
    d["links"].append({"endpoints": ["s1", "s0"], "name": "w0-s0"})
    e = _err(d)
    assert e.path == "links[2].name" and "used by links[0]" in e.message


def test_switch_loop_is_refused_unless_stp():
    d = {"name": "tri", "nodes": {"a": {"kind": "switch"}, "b": {"kind": "switch"}, "c": {"kind": "switch"},
                                  "w0": {"kind": "worker"}, "w1": {"kind": "worker"}},
         "links": [{"endpoints": ["w0", "a"]}, {"endpoints": ["w1", "b"]}, {"endpoints": ["a", "b"]},
                   {"endpoints": ["b", "c"]}, {"endpoints": ["c", "a"]}]}
    e = _err(d)
    assert e.path == "links[4].endpoints" and "loop" in e.message and "stp" in e.hint
    assert "closes the loop c - b - a - c;" in e.message, e.message  # back where it started
    for s in "abc":
        d["nodes"][s]["stp"] = True
    assert len(load_topology_dict(d).links) == 5


def test_disconnected_topology_is_refused():
    d = star(2)
    d["nodes"].update({"s9": {"kind": "switch"}, "x": {"kind": "worker"}})
    d["links"].append({"endpoints": ["x", "s9"]})
    e = _err(d)
    assert e.path == "links" and "not connected" in e.message


def test_file_errors(tmp_path):
    with pytest.raises(TopologyError, match="does not exist"):
        load_topology(tmp_path / "nope.yaml")
    p = tmp_path / "t.yaml"
    p.write_text("name: x\nnodes: [\n")
    with pytest.raises(TopologyError, match="not valid YAML at line"):
        load_topology(p)
    p.write_text(yaml.safe_dump(dumbbell()))
    assert load_topology(p).name == "db"


def test_two_workers_directly_linked():
    d = {"name": "pair", "nodes": {"a": {"kind": "worker"}, "b": {"kind": "worker"}},
         "links": [{"endpoints": ["a", "b"], "rate": "1gbit"}]}
    t = load_topology_dict(d)
    assert not t.switches and len(t.workers) == 2


def test_json_schema_accepts_shipped_and_rejects_typos():
    jsonschema = pytest.importorskip("jsonschema")
    import json

    schema = json.loads((ROOT / "topologies" / "schema.json").read_text())
    for path in SHIPPED:
        jsonschema.validate(yaml.safe_load(path.read_text()), schema)
    for bad in (mutate(lambda d: d["links"][2].update(rate="100mbps")),
                mutate(lambda d: d["nodes"]["w0"].update(colour="x")),
                mutate(lambda d: d.update(colour="red"))):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)


def test_duplicate_yaml_keys_are_errors_naming_the_key_and_line(tmp_path):
    p = tmp_path / "dup.yaml"
    p.write_text("name: dup\nnodes:\n  s0: {kind: switch}\n  w0: {kind: worker}\n  w1: {kind: worker}\n"
                 "  w0: {kind: switch}\nlinks:\n  - endpoints: [w0, s0]\n  - endpoints: [w1, s0]\n")
    with pytest.raises(TopologyError) as e:
        load_topology(p)
    assert "duplicate key 'w0' at line 6 (first at line 4)" in str(e.value)


@pytest.mark.parametrize("name", ["tb\n", "targets", "monitors", "a/b", "..", ""])
def test_testbed_names_match_in_full_and_never_name_state_folders(name):
    with pytest.raises(TopologyError):
        load_topology_dict({**mutate(lambda d: None), "name": name})


def test_placement_groups_workers_by_the_switch_they_hang_off():
    from testbed.runs.launch import placement, placement_dict, rank_env
    from workloads import placement as wp

    three = load_topology(Path("testbed/topologies/three_switch.yaml"))
    seats = placement(three)
    assert [(s.node, s.switch, s.group_rank, s.local_rank, s.local_world_size) for s in seats] == \
        [(f"w{r}", "s1" if r < 4 else "s2", r // 4, r % 4, 4) for r in range(8)]
    d = placement_dict(seats)
    assert d["groups"] == [[0, 1, 2, 3], [4, 5, 6, 7]] and d["names"] == ["s1", "s2"]
    # what the ranks build from these variables is the same placement
    envs = [rank_env(rank=s.rank, world=8, node=s.node, iface="eth0", master_addr="10.0.0.1", gpu=None,
                     threads=1, base={}, seat=s) for s in seats]
    seen = [(int(e["TESTBED_SWITCH_INDEX"]), int(e["TESTBED_SWITCH_RANK"]), int(e["TESTBED_SWITCH_SIZE"]),
             e["TESTBED_SWITCH"], e["TESTBED_HOST"]) for e in envs]
    built = wp.build(5, seen)
    assert [list(g) for g in built.groups] == d["groups"] and list(built.names) == d["names"]
    # torchrun's variables: each worker a node of one process, so a stock script's
    # torch.cuda.set_device(int(os.environ["LOCAL_RANK"])) picks the one GPU it sees
    gpu_envs = [rank_env(rank=s.rank, world=8, node=s.node, iface="eth0", master_addr="10.0.0.1", gpu=s.rank % 2,
                         threads=1, base={}, seat=s) for s in seats]
    assert [(e["LOCAL_RANK"], e["LOCAL_WORLD_SIZE"], e["GROUP_RANK"], e["CUDA_VISIBLE_DEVICES"]) for e in gpu_envs] \
        == [("0", "1", str(r), str(r % 2)) for r in range(8)]
    # two workers wired to each other: each is a domain of its own
    t = load_topology_dict({"name": "pair", "nodes": {"a": {"kind": "worker"}, "b": {"kind": "worker"}},
                            "links": [{"endpoints": ["b", "a"]}]})
    assert [(s.node, s.switch, s.group_rank, s.local_rank) for s in placement(t)] == [("a", "a", 0, 0),
                                                                                   ("b", "b", 1, 0)]


def test_link_schedules_and_traffic_load_check_and_roundtrip():
    from tests.helpers import dumbbell

    d = dumbbell("sch", rate="100mbit")
    d["links"][2]["schedule"] = [{"at": "0s", "rate": "10mbit"}, {"at": "2s", "rate": "20mbit"},
                                 {"at": "4s", "rate": "10mbit"}]
    d["links"][2]["loop"] = True
    d["traffic"] = [{"from": "w0", "to": "w1", "flows": 2}, {"from": "w1", "to": "w0", "rate": "5mbit",
                                                               "on": "2s", "off": "500ms"}]
    t = load_topology_dict(d)
    s = t.links[2].schedule
    assert [st.at_s for st in s.steps] == [0.0, 2.0] and s.period_s == 4.0
    assert [f.label() for f in t.traffic] == ["w0->w1 x2", "w1->w0 5mbit on 2s off 0.5s"]
    assert load_topology_dict(t.to_dict()) == t
    # a set_links-style replace keeps the schedule
    from dataclasses import replace
    assert replace(t.links[2], forward=t.links[2].reverse).schedule == s


@pytest.mark.parametrize("edit, words", [
    (lambda d: d["links"][2].update(loop=True), "links[2].loop: loop without a schedule"),
    (lambda d: d["links"][2].update(schedule=[{"at": "0s", "rate": "10mbps"}]), "links[2].schedule[0]"),
    (lambda d: d["links"][2].update(schedule=[{"at": "0s", "rate": "10mbit", "delay": "5ms", "jitter": "1ms"}]),
     "unknown key 'jitter'"),
    (lambda d: d["links"][2].update(limit=10, schedule=[{"at": "0s", "rate": "10mbit"}]), None),
    (lambda d: d.update(traffic=[{"from": "w0", "to": "s1"}]), "traffic[0].to: 's1' is not a worker"),
    (lambda d: d.update(traffic=[{"from": "w0", "to": "w0"}]), "both 'w0'"),
    (lambda d: d.update(traffic=[{"from": "w0", "to": "w1", "on": "1s"}]), "needs both on and off"),
    (lambda d: d.update(traffic=[{"from": "w0", "to": "w1", "rate": "fast"}]), "traffic[0].rate"),
    (lambda d: d.update(traffic={"from": "w0"}), "traffic: must be a list"),
])
def test_schedule_and_traffic_errors_name_the_path(edit, words):
    from tests.helpers import dumbbell
    from testbed.common.errors import TestbedError

    d = dumbbell("bad", rate="100mbit")
    edit(d)
    if words is None:
        load_topology_dict(d)
        return
    with pytest.raises(TestbedError, match=re.escape(words)):
        load_topology_dict(d)


def test_gpu_runs_spread_unpinned_workers_over_the_host_gpus_and_containers_count_from_zero():
    from testbed.nodes.base import Backend
    from testbed.nodes.docker.backend import DockerBackend
    from testbed.runs.experiment import RunRequest
    from testbed.runs.launch import gpu_for, rank_env

    # gpu: pins; otherwise round-robin by rank over the host's GPUs; no GPUs: a CPU rank
    assert [gpu_for(r, None, [0, 1, 2]) for r in range(5)] == [0, 1, 2, 0, 1]
    assert gpu_for(4, 2, [0, 1]) == 2 and gpu_for(0, None, []) is None
    env = rank_env(rank=0, world=1, node="w0", iface="eth0", master_addr="10.0.0.1", gpu=3, threads=1, base={})
    assert env["CUDA_VISIBLE_DEVICES"] == "3"
    assert rank_env(rank=0, world=1, node="w0", iface="eth0", master_addr="x", gpu=None, threads=1,
                    base={"CUDA_VISIBLE_DEVICES": "0,1"})["CUDA_VISIBLE_DEVICES"] == "", "a CPU rank sees no GPU"
    # a namespace sees the host's numbering; a container only its own GPU, as device 0
    assert Backend.cuda_visible(None, None, 3) == "3" and Backend.shares_host_gpus
    assert DockerBackend.cuda_visible(None, None, 3) == "0" and DockerBackend.cuda_visible(None, None, None) == ""
    assert not DockerBackend.shares_host_gpus
    # the run reads the workload's --backend as argparse does (the last one wins)
    assert RunRequest("allreduce", ["--epochs", "1"]).compute_backend == "auto"
    assert RunRequest("allreduce", ["--backend", "gloo", "--backend=nccl"]).compute_backend == "nccl"


# ------------------------------------------------- every field through to_dict, sections' errors, helpers
def _every_field() -> dict:
    """A single-host topology that sets every key the loader takes, on every kind of node."""
    d = dumbbell("every", rate="100mbit", delay="5ms", jitter="1ms", loss="0.1%", limit=5000)
    d["subnet"] = "10.77.0.0/24"
    d["defaults"] = {"backend": "netns", "link": {"rate": "1gbit", "delay": "1ms"}, "image": "testbed/worker:cpu",
                     "vcpus": 2, "sysctls": {"net.ipv4.tcp_congestion_control": "reno"}}
    d["nodes"]["w0"].update(backend="docker", gpu=1, cpus=2, memory="1g", env={"A": "1"}, volumes=["/a:/b:ro"])
    d["nodes"]["w1"].update(backend="vm", memory="2G", accel="tcg", gpu_pci="0000:65:00.0", kernel="/k",
                            sysctls={"net.core.somaxconn": 512})
    d["nodes"]["s0"]["stp"] = True
    d["links"][2].update(name="core", forward={"rate": "50mbit"}, reverse={"delay": "10ms"})
    d["links"][1].update(loop=True, schedule=[{"at": "0s", "rate": "10mbit"},
                                              {"at": "2s", "rate": "20mbit", "delay": "3ms"},
                                              {"at": "3s", "rate": "30mbit", "loss": "1%"},
                                              {"at": "4s", "rate": "10mbit"}])
    d["traffic"] = [{"from": "w0", "to": "w1", "flows": 2},
                    {"from": "w1", "to": "w0", "rate": "5mbit", "on": "2s", "off": "500ms"}]
    return d


def _every_host_field() -> dict:
    return {"name": "mh", "vxlan": {"port": 14789, "mtu": 1400},
            "hosts": [{"name": "h1", "address": "192.0.2.11", "key": "/k", "known_hosts": "/kh",
                       "accept_new_host_key": True, "testbed": "/opt/tb/bin/testbed"},
                      {"name": "h2", "address": "gpu2.example.org", "underlay": "192.0.2.12", "port": 2222,
                       "user": "ubuntu"}],
            "nodes": {"s0": {"kind": "switch"}, "s1": {"kind": "switch", "host": "h1"},
                      "s2": {"kind": "switch", "host": "h2"}, "w0": {"kind": "worker"},
                      "w1": {"kind": "worker"}, "w2": {"kind": "worker", "host": "h2", "backend": "docker"}},
            "links": [{"endpoints": ["w0", "s0"]}, {"endpoints": ["w1", "s1"]}, {"endpoints": ["w2", "s2"]},
                      {"endpoints": ["s1", "s0"], "rate": "100mbit"}, {"endpoints": ["s2", "s1"]}]}


@pytest.mark.parametrize("doc", [_every_field, _every_host_field], ids=["every field", "every host field"])
def test_every_field_round_trips_through_to_dict_and_a_yaml_file(doc, tmp_path):
    t = load_topology_dict(doc())
    assert load_topology_dict(t.to_dict()) == t
    p = tmp_path / "t.yaml"
    p.write_text(yaml.safe_dump(t.to_dict(), sort_keys=False))
    assert load_topology(p) == t
    assert load_topology(p).source == str(p)


def test_every_field_is_read_as_written():
    t = load_topology_dict(_every_field())
    w0, w1, s0 = t.node("w0"), t.node("w1"), t.node("s0")
    assert (w0.backend, w0.gpu, dict(w0.options)["cpus"], dict(w0.options)["image"]) == ("docker", 1, 2.0,
                                                                                       "testbed/worker:cpu")
    assert dict(w1.options)["vcpus"] == 2 and dict(w1.options)["memory"] == "2g"
    assert dict(w1.sysctls) == {"net.ipv4.tcp_congestion_control": "reno", "net.core.somaxconn": "512"}
    assert s0.stp and not t.node("s1").stp
    core = t.links[2]
    assert core.name == "core" and core.bottleneck
    assert core.forward.describe() == "50mbit delay 5ms±1ms loss 0.1% limit 5000p"
    assert core.reverse.describe() == "100mbit delay 10ms±1ms loss 0.1% limit 5000p"
    assert t.links[0].forward.describe() == "1gbit delay 1ms" and t.links[0].name == "w0-s0"
    assert t.links[1].schedule.loop and t.links[1].schedule.period_s == 4.0
    assert str(t.subnet) == "10.77.0.0/24" and t.needs_netem
    h = load_topology_dict(_every_host_field())
    assert (h.vxlan_port, h.mtu, h.data_mtu) == (14789, 1400, 1400)
    assert h.host("h1").to_dict() == {"name": "h1", "address": "192.0.2.11", "underlay": "192.0.2.11", "user": "root",
                                      "port": 22, "key": "/k", "known_hosts": "/kh", "accept_new_host_key": True,
                                      "testbed": "/opt/tb/bin/testbed"}


@pytest.mark.parametrize("fn,path,words", [
    (lambda d: d.update(nodes=[]), "nodes", "expected a mapping"),
    (lambda d: d.update(nodes={}), "nodes", "no nodes"),
    (lambda d: d["nodes"].update(w0={"kind": "switch"}, w1={"kind": "switch"}), "nodes", "no workers"),
    (lambda d: d["nodes"].update(w0=None), "nodes.w0.kind", "missing kind None"),
    (lambda d: d["nodes"]["s0"].update(stp="yes"), "nodes.s0.stp", "true or false"),
    (lambda d: d["nodes"]["w0"].update(gpu=True), "nodes.w0.gpu", "device index"),
    (lambda d: d["nodes"]["w0"].update(host="h1"), "nodes.w0.host", "unknown host 'h1'"),
    (lambda d: d.update(defaults={"backend": "kvm"}), "defaults.backend", "choose one of: netns"),
    (lambda d: d.update(defaults={"link": {"rate": "10gbit", "delay": "10s"}}), "defaults.link", "more than"),
    (lambda d: d["links"][0].update(name=""), "links[0].name", "invalid link name"),
    (lambda d: d["links"][2].update(bottleneck="yes"), "links[2].bottleneck", "true or false"),
    # a direction block's error names the block; without one, the link
    (lambda d: d["links"][2].update(jitter="1ms", forward={"rate": "1gbit"}), "links[2].forward.jitter", "needs a delay"),
    (lambda d: d["links"][2].update(forward={"colour": "x"}), "links[2].forward.colour", "unknown key"),
    # every distinct schedule step is checked against both directions, as link set would
    (lambda d: d["links"][2].update(delay="10s", schedule=[{"at": "0s", "rate": "10mbit"},
                                                           {"at": "1s", "rate": "10gbit"}]),
     "links[2].schedule (at 1s, forward)", "more than"),
    (lambda d: d.update(subnet="127.0.0.0/8"), "subnet", "loopback"),
    (lambda d: d.update(subnet=None), "subnet", "not an IPv4 network"),
    (lambda d: d.update(hosts="x"), "hosts", "must be a list"),
    (lambda d: d.update(hosts=[{"name": "h1"}]), "hosts[0].address", "missing"),
    (lambda d: d.update(hosts=[{"name": "h1", "address": "192.0.2.1", "key": ""}]), "hosts[0].key", "file path"),
    (lambda d: d.update(vxlan="x"), "vxlan", "expected a mapping"),
    (lambda d: d.update(vxlan={"mtu": 1500, "tos": 1}), "vxlan.tos", "unknown key"),
])
def test_each_section_names_the_path_of_its_errors(fn, path, words):
    e = _err(mutate(fn))
    assert e.path == path, str(e)
    assert words in str(e)


def test_defaults_for_a_backend_no_worker_uses_are_not_checked():
    d = dumbbell()
    d["defaults"] = {"image": "NOT A VALID IMAGE", "vcpus": 999}
    assert all(not w.options for w in load_topology_dict(d).workers)


def test_hosts_travel_as_json_and_are_checked_by_the_topology_rules():
    import json

    from testbed.model.topology import host_from_json

    h = load_topology_dict(_every_host_field()).host("h1")
    assert host_from_json(json.dumps(h.to_dict())) == h
    with pytest.raises(TopologyError) as e:
        host_from_json("{not json")
    assert e.value.path == "hosts[0]" and "not JSON" in e.value.message
    with pytest.raises(TopologyError) as e:
        host_from_json(json.dumps({"name": "local", "address": "192.0.2.1"}))
    assert e.value.path == "hosts[0].name" and "needs no entry" in e.value.message


def test_shapes_from_files_and_flags_follow_the_loader_rules():
    from testbed.model.topology import Shape, check_shape, parse_shape_values, shape_from_dict

    for s in (t.shape(d) for t in load_topology_dict(_every_field()).links for d in ("forward", "reverse")):
        assert shape_from_dict(s.to_dict()) == s
    with pytest.raises(TopologyError) as e:
        shape_from_dict({"rate": "1gbit", "jitter": "1ms"}, "links[1].forward")
    assert e.value.path == "links[1].forward.jitter"
    with pytest.raises(TopologyError) as e:
        shape_from_dict({"rate": "1gbit", "burst": 1})
    assert e.value.path == "shape.burst"
    flags = {"rate": "--bw", "delay": "--delay", "loss": "--loss"}
    got = parse_shape_values({"rate": "100mbit", "delay": None, "loss": "1%"}, flags)
    assert set(got) == {"rate", "loss"} and got["rate"].bps == 100 * 10**6
    with pytest.raises(TopologyError) as e:
        parse_shape_values({"rate": "100mbps"}, flags)
    assert e.value.path == "--bw" and "ambiguous" in e.value.message
    assert check_shape(Shape(), "x") == Shape()


def test_file_errors_name_the_file(tmp_path):
    with pytest.raises(TopologyError, match="topology file .* is a directory, not a regular file"):
        load_topology(tmp_path)
    p = tmp_path / "nested.yaml"
    p.write_text("name: d\nnodes:\n  w0: {kind: worker, kind: switch}\nlinks: []\n")
    with pytest.raises(TopologyError, match="duplicate key 'kind' at line 3"):
        load_topology(p)
    p.write_text("name: x\n? [a, b]\n: 1\n")
    with pytest.raises(TopologyError, match="not valid YAML"):
        load_topology(p)
    p.write_text("- 1\n")
    with pytest.raises(TopologyError, match="expected a mapping"):
        load_topology(p)
