"""CUDA_VISIBLE_DEVICES as each node numbers its GPUs (issue 57): a stock script that picks
cuda:LOCAL_RANK (0) must find its GPU in a namespace, a container and a VM, here and on
another host."""

from __future__ import annotations

from testbed.hosts.runplace import RemoteRun
from testbed.model.nodes import Node
from testbed.nodes.docker import DockerBackend
from testbed.nodes.netns import NetnsBackend
from testbed.nodes.vm import VmBackend


def _node(**options) -> Node:
    return Node("w1", "worker", gpu=3, options=tuple(options.items()))


def test_each_backend_numbers_the_gpu_a_rank_gets_as_the_node_sees_it():
    assert NetnsBackend().cuda_visible(_node(), 3) == "3"  # a namespace sees every host GPU
    assert DockerBackend().cuda_visible(_node(), 3) == "0"  # a container has its one GPU as 0
    assert DockerBackend().cuda_visible(_node(), None) == ""
    assert VmBackend().cuda_visible(_node(gpu_pci="0000:17:00.0"), None) == "0"  # passed through: the guest's 0
    assert VmBackend().cuda_visible(_node(), None) == ""


def test_a_rank_on_another_host_is_numbered_as_its_node_there_numbers_it():
    remote = object.__new__(RemoteRun)
    for backend, want in ((NetnsBackend(), "3"), (DockerBackend(), "0"), (VmBackend(), "")):
        assert remote.environment(backend, _node(), 3)[1] == want  # before: None, the host's index "3"
    assert remote.environment(VmBackend(), _node(gpu_pci="0000:17:00.0"), None) == ({}, "0")
