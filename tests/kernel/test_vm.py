"""backend: vm end to end: QEMU guests behind shaped links, runs in them, crashes, netem.

Needs qemu-system-x86 and the guest (`testbed image build --vm`, which .ci/run does);
skips with the reason otherwise. On this kind of host KVM cannot run the guest, so the
guests run under TCG (software emulation): slow, so the training here is tiny.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from testbed.engine.core import FAULT_ENV
from tests.helpers import iperf3
from tests.kernel.conftest import cli, cli_json, run

pytestmark = [pytest.mark.kernel, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module", autouse=True)
def guest():
    from testbed.nodes.vm import image as vmimage

    if shutil.which("qemu-system-x86_64") is None:
        pytest.skip("qemu-system-x86_64 missing (apt-get install qemu-system-x86)")
    try:
        return vmimage.current()
    except Exception as e:
        pytest.skip(f"VM guest not built ({e}); `testbed image build --vm`")


def _vm_dumbbell(name: str, rate: str = "100mbit", **w0) -> dict:
    return {"name": name, "defaults": {"backend": "vm"},
            "nodes": {"s0": {"kind": "switch"}, "s1": {"kind": "switch"},
                      "w0": {"kind": "worker", **w0}, "w1": {"kind": "worker"}},
            "links": [{"endpoints": ["w0", "s0"]}, {"endpoints": ["w1", "s1"]},
                      {"endpoints": ["s0", "s1"], "rate": rate, "bottleneck": True}]}


def _write(tmp_path, d: dict) -> Path:
    p = tmp_path / f"{d['name']}.yaml"
    p.write_text(yaml.safe_dump(d))
    return p


def _qemus(testbed: str) -> list[int]:
    from testbed.nodes.vm.backend import qemu_pids

    return [p for w in ("w0", "w1") for p in qemu_pids(f"{testbed}.{w}")]


def _wait_for_rank_in_guest(testbed: str, node: str, run: subprocess.Popen, timeout: float = 400) -> None:
    """Until a training rank runs in ``node``'s guest: `testbed run` has started it there
    through the guest agent, which now relays its output and heartbeats. A fault made from
    here on (QEMU killed or stopped) strikes during the run; the test need not wait for the
    rank to import torch under TCG (about a minute with two guests) before making it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert run.poll() is None, "the run ended before its rank started in the guest"
        r = cli("exec", "-t", testbed, node, "--", "pgrep", "-f", "workloads.train")
        if r.returncode == 0 and r.stdout.split():
            return
        time.sleep(0.5)
    raise AssertionError(f"no training rank ever ran in {node}'s guest")


def test_two_vm_workers_ping_and_goodput_follows_the_shaped_rate(clean_kernel, tmp_path):
    from testbed import Testbed, load_topology_dict

    from testbed.nodes.vm import image as vmimage

    d = _vm_dumbbell("vmg", sysctls={"net.ipv4.tcp_congestion_control": "reno"})
    # w1 names its kernel (a directory as an unpacked kernel package leaves it): the default's here
    d["nodes"]["w1"]["kernel"] = str(Path(vmimage.current()["kernel"]).parent)
    with Testbed.up(load_topology_dict(d)) as tb:
        assert len(_qemus("vmg")) == 2
        # each worker is its own kernel (the guest's, not the host's), with its own sysctls
        host = os.uname().release
        guest = tb.exec("w0", ["uname", "-r"], capture_output=True, text=True).stdout.strip()
        assert guest and guest != host
        cc = [tb.exec(w, ["sysctl", "-n", "net.ipv4.tcp_congestion_control"], capture_output=True,
                      text=True).stdout.strip() for w in ("w0", "w1")]
        assert cc[0] == "reno" and cc[1] != "reno"
        assert tb.exec("w0", ["ping", "-c3", "-i0.2", "-W2", tb.address("w1")]).returncode == 0
        assert tb.exec("w1", ["ping", "-c1", "-W2", tb.address("w0")]).returncode == 0
        # files in and out through the node interface
        src = tmp_path / "in.bin"
        src.write_bytes(os.urandom(100_000))
        b, info = tb.backend("w1"), tb.node("w1")
        b.put(info, src, "/root/in.bin")
        b.get(info, "/root/in.bin", tmp_path / "out.bin")
        assert (tmp_path / "out.bin").read_bytes() == src.read_bytes()
        # TCP goodput across the 100 Mbit/s bottleneck, the tap in the path
        res = iperf3(tb, 8, "-O", "2")
        bps = res["end"]["sum_received"]["bits_per_second"]
        print(f"VM-to-VM goodput: {bps / 1e6:.1f} Mbit/s of 100")
        assert 0.85 * 100e6 <= bps <= 1.0 * 100e6, bps / 1e6
    assert _qemus("vmg") == []


def test_runs_on_vm_workers_cross_the_bottleneck_and_a_killed_vm_ends_the_run(clean_kernel, tmp_path):
    topo = _write(tmp_path, _vm_dumbbell("vmr", rate="1gbit"))
    runs = tmp_path / "runs"
    cli_json("up", str(topo))
    try:
        # your own script, from its directory as the guest sees the host's (read-only) files; the
        # proof: the tc counters of the shaped bottleneck carried its collectives, both ways
        u = cli_json("run", "--script", str(ROOT / "examples" / "ddp_digits.py"), "--testbed", "vmr", "--bw",
                     "100mbit", "--out", str(runs), "4", timeout=600)
        assert (u["status"], u["proof"], u["iterations"], u["world_size"]) == ("ok", "passed", 4, 2), u
        assert all(row["measured_bytes"] >= row["bound_bytes"] > 0 for row in u["proof_links"].values()), u

        p = subprocess.Popen([sys.executable, "-m", "testbed.cli", "run", "allreduce", "--testbed", "vmr",
                              "--out", str(runs), "--max-iters", "100000", "--eval-every", "100000"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            _wait_for_rank_in_guest("vmr", "w1", p)
            from testbed.nodes.vm.backend import qemu_pids

            os.kill(qemu_pids("vmr.w1")[0], signal.SIGKILL)
            t0 = time.monotonic()
            _, err = p.communicate(timeout=120)
            took = time.monotonic() - t0
        finally:
            if p.poll() is None:
                p.kill()
        assert p.returncode == 1, err
        assert "node w1" in err and "VM is no longer running" in err, err
        assert "Traceback" not in err
        assert took < 60, took
    finally:
        cli_json("down", "vmr")
    assert _qemus("vmr") == []


@pytest.mark.parametrize("step", ["first-vm", "await", "lost-ledger"])
def test_kill9_during_up_then_down_all_leaves_no_qemu(clean_kernel, tmp_path, step):
    topo = _write(tmp_path, _vm_dumbbell("vmk"))
    actions = [a["action"] for a in cli_json("up", str(topo), "--dry-run")["actions"]]
    n = actions.index("CreateVeth") if step == "first-vm" else actions.index("AwaitVMs")
    r = cli("up", str(topo), env={FAULT_ENV: str(n)})
    assert r.returncode == -signal.SIGKILL
    deadline = time.monotonic() + 10  # QEMU is exec'd by a helper that may still be starting
    while not _qemus("vmk") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _qemus("vmk"), "the crash should have left QEMU running for down to find"
    if step == "lost-ledger":  # then down --all finds the testbed by its namespaces' tags
        shutil.rmtree(Path(clean_kernel["state_dir"]) / "vmk")
    assert cli_json("down", "--all")["removed"] == ["vmk"]
    assert _qemus("vmk") == []
    assert "vmk" not in run(["ip", "netns", "list"]).stdout


def test_bad_vm_options_are_refused_before_anything_is_made(clean_kernel, tmp_path):
    for key, value, what in (("memory", "12", "memory"), ("accel", "hvf", "accel"), ("vcpus", 0, "vcpus"),
                             ("gpu_pci", "65:00", "gpu_pci"), ("image", "x", "image")):
        r = cli("up", str(_write(tmp_path, _vm_dumbbell("vmbad", **{key: value}))))
        assert r.returncode == 1 and f"nodes.w0.{what}" in r.stderr and "Traceback" not in r.stderr, r.stderr
    r = cli("up", str(_write(tmp_path, _vm_dumbbell("vmbad", gpu_pci="0000:ff:1f.7"))))
    assert r.returncode == 1 and "gpu_pci 0000:ff:1f.7 is not bound to vfio-pci" in r.stderr, r.stderr
    r = cli("up", str(_write(tmp_path, _vm_dumbbell("vmbad", kernel=str(tmp_path)))))
    assert r.returncode == 1 and f"node w0: kernel: {tmp_path} has no vmlinuz" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_netem_tests_pass_inside_a_vm(clean_kernel, tmp_path):
    """This host's kernel has no sch_netem; the guest's has. Boot one VM worker and run the
    project's netem tests inside it, as root, against the guest's kernel."""
    from testbed import Testbed, load_topology_dict

    d = {"name": "vmn", "defaults": {"backend": "vm"},
         "nodes": {"s0": {"kind": "switch"}, "w0": {"kind": "worker", "memory": "2g", "vcpus": 2}},
         "links": [{"endpoints": ["w0", "s0"]}]}
    with Testbed.up(load_topology_dict(d)) as tb:
        argv = [sys.executable, "-P", "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", "-rs",
                "tests/kernel/test_netem.py", "tests/kernel/test_up_down.py::test_netem_topology_is_refused_or_works"]
        # no plugin is needed there: pytest's scan of every installed package's entry points
        # and xdist's import took 8 of the 12 s to collect these tests in a TCG guest
        r = subprocess.run(tb.command("w0", argv, cwd=ROOT), capture_output=True, text=True, timeout=1200,
                           env={**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"})
    print(r.stdout[-3000:])
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert "6 passed" in r.stdout and "skipped" not in r.stdout, r.stdout[-2000:]
