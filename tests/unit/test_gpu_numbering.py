"""CUDA_VISIBLE_DEVICES as each node numbers its GPUs (issue 57): a stock script that picks
cuda:LOCAL_RANK (0) must find its GPU in a namespace and a container, here and on another
host. (A VM's passed-through GPU is not yet numbered 0: the rank's node record carries no
gpu_pci; issue 57.)"""

from __future__ import annotations

from testbed.hosts.runplace import RemoteRun
from testbed.nodes.docker import DockerBackend
from testbed.nodes.netns import NetnsBackend
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
