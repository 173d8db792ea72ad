"""backend: vm logic that needs no QEMU: options, the guest's module order and cpio, the
agent's wire format and request checks, the plan of a VM worker."""

from __future__ import annotations

import socket
import stat
import threading

import pytest

from testbed.nodes.vm import agent as wire
from testbed.common.errors import TopologyError
from tests.helpers import agent_frames


def test_vm_options_are_validated_with_the_field_named():
    from testbed.model.backend_options import VmOptions

    b = VmOptions()
    assert dict(b.validate({}, "nodes.w0")) == {"vcpus": 1, "memory": "2g", "accel": "auto"}
    assert dict(b.validate({"vcpus": 2, "memory": "512M", "accel": "tcg", "gpu_pci": "0000:65:00.0"}, "n"))[
        "memory"] == "512m"
    for opts, field in (({"vcpus": 0}, "vcpus"), ({"vcpus": True}, "vcpus"), ({"memory": "100m"}, "memory"),
                        ({"memory": 2}, "memory"), ({"accel": "hvf"}, "accel"), ({"gpu_pci": "65:00.0"}, "gpu_pci"),
                        ({"image": "x"}, "image"), ({"kernel": "boot/vmlinuz"}, "kernel"),
                        ({"kernel": "/a/../b"}, "kernel")):
        with pytest.raises(TopologyError) as e:
            b.validate(opts, "nodes.w0")
        assert e.value.path == f"nodes.w0.{field}", e.value


def _ko(name: str, depends: str) -> bytes:
    return b"\x7fELF junk\0license=GPL\0depends=" + depends.encode() + b"\0name=" + name.encode() + b"\0"


def test_module_order_puts_dependencies_first_and_skips_built_ins(tmp_path):
    from testbed.nodes.vm.image import module_order

    (tmp_path / "kernel").mkdir()
    for name, deps in (("virtio_net", "net_failover,virtio"), ("net_failover", "failover"), ("failover", ""),
                       ("virtio", ""), ("sch_netem", "")):
        (tmp_path / "kernel" / f"{name}.ko").write_bytes(_ko(name, deps))
    order = [n for n, _ in module_order(tmp_path, ("virtio_net", "sch_netem", "ext4"))]
    assert order.index("failover") < order.index("net_failover") < order.index("virtio_net")
    assert order.index("virtio") < order.index("virtio_net")
    assert "ext4" not in order and order.count("virtio") == 1 and "sch_netem" in order


def test_cpio_is_a_newc_archive_the_kernel_can_read(tmp_path):
    from testbed.nodes.vm.image import _cpio

    data = _cpio([("bin", stat.S_IFDIR | 0o755, b""), ("bin/x", stat.S_IFREG | 0o755, b"hello")])
    assert data.startswith(b"070701") and b"TRAILER!!!" in data and len(data) % 4 == 0
    import shutil
    import subprocess

    tool = ["cpio"] if shutil.which("cpio") else (["/bin/busybox", "cpio"] if shutil.which("/bin/busybox") else None)
    if tool is None:
        pytest.skip("neither cpio nor busybox installed: checked the header only")
    r = subprocess.run([*tool, "-i", "-d"], input=data, cwd=tmp_path, capture_output=True)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "bin" / "x").read_bytes() == b"hello"


def test_frames_round_trip_and_a_closed_peer_reads_as_none():
    a, b = socket.socketpair()
    with a, b:
        wire.send(a, wire.STDOUT, b"x" * 70000)
        wire.send(a, wire.EXIT, b"0")
        assert wire.recv(b) == (wire.STDOUT, b"x" * 70000)
        assert wire.recv(b) == (wire.EXIT, b"0")
        a.close()
        assert wire.recv(b) is None


@pytest.mark.parametrize("req, problem", [
    ({"op": "exec", "argv": []}, "argv"),
    ({"op": "exec", "argv": ["ls"], "env": {"A=B": "x"}}, "env"),
    ({"op": "exec", "argv": ["ls"], "mounts": ["relative"]}, "mounts"),
    ({"op": "exec", "argv": ["ls"], "mounts": ["/a/../etc"]}, "mounts"),
    ({"op": "exec", "argv": ["ls"], "cwd": "tmp"}, "cwd"),
])
def test_the_agent_refuses_malformed_requests(req, problem):
    assert problem in wire._valid_request(req)
    assert wire._valid_request({"op": "exec", "argv": ["ls"], "env": {"A": "b"}, "mounts": ["/x"], "cwd": "/"}) is None


def test_the_agent_refuses_a_wrong_token_and_runs_a_command_with_a_right_one(tmp_path, monkeypatch):
    """The agent's request handling, on a socket pair (no guest): a bad token gets an
    error and nothing runs; a good one runs the command and streams its output and status."""
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    monkeypatch.setattr(wire, "HOST_SHARE", "")
    agent = wire.Agent({"token_file": str(token)})

    def ask(req: dict, stdin: bytes = b"") -> list:
        import json

        a, b = socket.socketpair()
        t = threading.Thread(target=agent.handle, args=(b,))
        t.start()
        wire.send(a, wire.REQUEST, json.dumps(req).encode())
        try:
            if stdin:
                wire.send(a, wire.STDIN, stdin)
            wire.send(a, wire.STDIN_EOF)
        except BrokenPipeError:
            pass  # the agent refused the request and closed first: its answer is still to be read
        return agent_frames(a, t)

    marker = tmp_path / "ran"
    bad = ask({"token": "nope", "op": "exec", "argv": ["touch", str(marker)]})
    assert bad == [(wire.ERROR, b"bad token")] and not marker.exists()
    frames = ask({"token": "s3cret", "op": "exec", "argv": ["sh", "-c", "cat; echo err >&2; exit 3"],
                  "env": {"PATH": "/usr/bin:/bin"}}, stdin=b"hello")
    out = b"".join(d for k, d in frames if k == wire.STDOUT)
    errs = b"".join(d for k, d in frames if k == wire.STDERR)
    assert out == b"hello" and errs == b"err\n" and frames[-1] == (wire.EXIT, b"3")


def test_a_vm_worker_is_planned_behind_its_bridge_with_the_address_in_the_guest(monkeypatch):
    from testbed.engine import planner as plan
    from testbed.nodes.vm import image as vmimage
    from testbed.plan.actions import AddAddress, CreateVeth, SetSysctl
    from testbed.nodes.vm.backend import AwaitVMs, CreateVmNic, StartVM
    from testbed.model.topology import load_topology_dict
    import ipaddress

    monkeypatch.setattr(vmimage, "current", lambda: {"kernel": "/k/vmlinuz", "initrd": "/k/initrd", "abi": "x"})
    t = load_topology_dict({"name": "pv", "nodes": {"s0": {"kind": "switch"},
                                                     "w0": {"kind": "worker", "backend": "vm",
                                                            "sysctls": {"net.core.somaxconn": 512}},
                                                     "w1": {"kind": "worker"}},
                            "links": [{"endpoints": ["w0", "s0"]}, {"endpoints": ["s0", "w1"]}]})
    p = plan.make_plan(t, ipaddress.ip_network("10.9.0.0/16"))
    kinds = [type(a) for a in p.actions]
    vm = next(a for a in p.actions if isinstance(a, StartVM))
    assert vm.address == "10.9.0.1/16" and vm.sysctls == ("net.core.somaxconn=512",) and vm.accel == "auto"
    assert CreateVmNic in kinds and kinds[-1] is AwaitVMs
    veth0 = next(a for a in p.actions if isinstance(a, CreateVeth) and a.link == 0)
    assert (veth0.ns, veth0.master) == ("pv.w0", "vmbr0")
    addrs = [a.ns for a in p.actions if isinstance(a, AddAddress)]
    assert addrs == ["pv.w1"], "the VM's address is the guest's, not the host-side namespace's"
    assert not [a for a in p.actions if isinstance(a, SetSysctl)]
    assert "-name" in vm.argv("tcg") and "testbed-vm:pv.w0" in vm.argv("tcg")


def test_a_vm_state_directory_outside_the_testbeds_is_left_alone(tmp_path, monkeypatch):
    from testbed.hosts.local import LocalHost
    from testbed.plan.actions import Teardown
    from testbed.nodes.vm.backend import StartVM

    monkeypatch.setenv("TESTBED_STATE_DIR", str(tmp_path))
    victim = tmp_path / "precious"
    victim.mkdir()
    a = StartVM("pv.w0", "w0", str(victim), "10.0.0.1/8", "/k", "/i", "tcg")
    td = Teardown("pv", set(), LocalHost())
    a.release(td)
    a.undo(td)
    assert victim.exists() and td.problems
