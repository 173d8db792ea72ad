"""CUDA_VISIBLE_DEVICES as each node numbers its GPUs (issue 57): a stock script that picks
cuda:LOCAL_RANK (0) must find its GPU in a namespace and a container, here and on another
host, and a VM's passed-through GPU as the guest's GPU 0 (issue 57, item 6)."""

from __future__ import annotations

import ipaddress

from testbed import load_topology_dict
from testbed.engine.planner import make_plan
from testbed.hosts.runplace import LocalRun, RemoteRun
from testbed.nodes.docker.backend import DockerBackend
from testbed.nodes.netns import NetnsBackend
from testbed.nodes.vm.backend import VmBackend
from testbed.plan.plan import NodeInfo


def _node() -> NodeInfo:
    """What a rank's backend is handed: the plan's record of the node."""
    return NodeInfo("w1", "worker", "netns", "t.w1", "eth0", "10.0.0.2/24", rank=1, gpu=3)


def test_each_backend_numbers_the_gpu_a_rank_gets_as_the_node_sees_it():
    assert NetnsBackend().cuda_visible(_node(), 3) == "3"  # a namespace sees every host GPU
    assert DockerBackend().cuda_visible(_node(), 3) == "0"  # a container has its one GPU as 0
    assert DockerBackend().cuda_visible(_node(), None) == ""


def test_a_rank_on_another_host_is_numbered_as_its_node_there_numbers_it():
    remote = object.__new__(RemoteRun)
    for backend, want in ((NetnsBackend(), "3"), (DockerBackend(), "0")):
        assert remote.environment(backend, _node(), 3)[1] == want  # before: None, the host's index "3"


def _vm_plan() -> dict[str, NodeInfo]:
    """The planned node records of two VM workers, one with a GPU passed through."""
    doc = {"name": "vmg", "defaults": {"backend": "vm"},
           "nodes": {"s0": {"kind": "switch"}, "w0": {"kind": "worker", "gpu_pci": "0000:65:00.0"},
                     "w1": {"kind": "worker"}},
           "links": [{"endpoints": ["w0", "s0"]}, {"endpoints": ["w1", "s0"]}]}
    return make_plan(load_topology_dict(doc), ipaddress.ip_network("10.9.0.0/24")).nodes


def test_a_vms_passed_through_gpu_is_the_guests_gpu_0_and_a_vm_without_one_has_none():
    nodes = _vm_plan()
    assert nodes["w0"].own_gpu is True and nodes["w1"].own_gpu is False  # decided when planned, kept in state
    vm = VmBackend()
    assert vm.cuda_visible(nodes["w0"], None) == "0"  # before: "" (no gpu:), hiding the guest's GPU
    assert vm.cuda_visible(nodes["w0"], 2) == "0"  # a host index means nothing inside
    assert vm.cuda_visible(nodes["w1"], None) == ""
    local = object.__new__(LocalRun)
    assert local.environment(vm, nodes["w0"], None)[1] == "0"


def test_every_backend_and_host_kind_numbers_a_rank_as_its_node_does():
    """The table: (backend, host kind) -> CUDA_VISIBLE_DEVICES for a rank given host GPU 3
    (a VM's, with its own GPU passed through)."""
    remote, own = object.__new__(RemoteRun), _vm_plan()["w0"]
    table = {}
    for b in (NetnsBackend(), DockerBackend(), VmBackend()):
        node = own if b.name == "vm" else _node()
        table[b.name, "local"] = b.cuda_visible(node, 3)  # LocalRun.environment's (it asks a container's engine too)
        table[b.name, "remote"] = remote.environment(b, node, 3)[1]
    assert table == {("netns", "local"): "3", ("netns", "remote"): "3", ("docker", "local"): "0",
                     ("docker", "remote"): "0", ("vm", "local"): "0", ("vm", "remote"): "0"}
