"""The kernel tests' two lanes (tests/lanes.py): which unit a test goes to, and the names of
the host's view each lane counts as its own."""

from __future__ import annotations

import re
from pathlib import Path

from tests import lanes
from tests.kernel import slurm_lab, sshhosts

KERNEL = Path(__file__).resolve().parents[1] / "kernel"


def test_every_waiting_file_exists_and_the_rest_are_the_main_lane():
    files = {p.name for p in KERNEL.glob("test_*.py")}
    assert lanes.WAITING <= files, lanes.WAITING - files
    for name in files:
        want = lanes.WAITING_UNIT if name in lanes.WAITING else lanes.MAIN
        assert lanes.unit(f"tests/kernel/{name}::test_x[a::b]") == want, name
    assert lanes.unit("tests/unit/test_lanes.py::test_x") is None
    assert lanes.unit("tests/workloads/test_slurm.py::test_x") is None


def test_the_slurm_labs_names_are_the_waiting_lanes_and_the_sshd_labs_are_not():
    nodes = [f"tbslurm{i}" for i in (1, 2, 12)]  # SlurmNode's netns, as slurm_lab.build names them
    for name in [slurm_lab.BRIDGE, "tbs1", "tbs2", "tbs10", *nodes]:
        assert lanes.waiting_host_name(name), name
    for name in [sshhosts.BRIDGE, "tbh1", "tbhost1", "tbs", "tbsx", "tbsl1", "sw0", "l0a", "lo", "docker0",
                 "three_switch", "slm.w0"]:
        assert not lanes.waiting_host_name(name), name


# a testbed's name as the kernel tests write it: dumbbell("NAME"), star(8, name="NAME"),
# {"name": "NAME"}, name: NAME in a YAML text, a topology file of topologies/, "-t", "NAME"
_NAME = re.compile(r"""(?:dumbbell|star|_vm_dumbbell)\(\s*(?:\d+\s*,\s*)?(?:name=)?["']([\w-]+)["']"""
                   r"""|["']name["']\s*:\s*["']([\w-]+)["']|\bname=["']([\w-]+)["']|^name:\s*([\w-]+)"""
                   r"""|topologies["/ ,]+["']?(\w+)\.yaml|["'](?:-t|--testbed)["'],\s*["']([\w-]+)["']""", re.M)


def _names(lane_files) -> set[str]:
    found = {next(g for g in m.groups() if g) for f in lane_files for m in _NAME.finditer(f.read_text())}
    return found - {"tmpfs"}  # mount -t tmpfs


def test_the_two_lanes_name_their_testbeds_apart():
    """A namespace's name is its testbed's: two lanes upping the same name at once collide."""
    files = sorted(KERNEL.glob("test_*.py"))
    waiting = _names(f for f in files if f.name in lanes.WAITING)
    main = _names(f for f in files if f.name not in lanes.WAITING)
    assert {"slm", "mon", "ctr", "fd"} <= waiting and {"three_switch", "vmr"} <= main  # the pattern finds them
    assert not waiting & main, waiting & main
