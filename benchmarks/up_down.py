"""`testbed up` / `down` wall time for stars of N workers, next to the batched-iproute2 floor.

A star of N workers on one switch; above 1023 workers (a Linux bridge's port limit) leaf
switches of 512 under a core switch. The floor creates the same kernel objects, read
from testbed's own plan, with the fewest processes iproute2 allows: one `ip -batch` for
the namespaces, then one `ip -n NS -batch` and one `tc -n NS -batch` per namespace
(batch lines cannot switch namespace). Both are measured in the same run, since these
machines are noisy. Needs root.

A Docker row (``--docker-sizes``, default 8,32; needs a running engine and the worker
image): `up`/`down` of a star of container workers next to creating and starting (then
removing) the same containers with the docker SDK alone, one after another as `up` does.

A VM row (``--vm-sizes``, default 1,4; needs qemu-system-x86 and `testbed image build
--vm`): `up` of a star of VM workers, i.e. boot to a ready agent in every guest, all
booting in parallel, next to the guest kernel alone booting to its initramfs (the
``tb.probe`` path: no root overlay, no agent) with the same accelerator.

A rootless row (``--rootless-user USER``, an ordinary user who can run this venv's
python; ``--rootless-sizes``, default 8,64,256): the ``testbed up``/``down`` commands as that
user (rootless mode) next to the same commands as root, alternating, both timed as whole
commands (process start included).

    sudo python -m benchmarks.up_down [--sizes 8,64,256,1024] [--docker-sizes 8,32] [--vm-sizes 1,4]
                                      [--rootless-user alice --rootless-sizes 8,64,256]
                                      [--repeats N] [--record DIR]

``--repeats N`` runs every row N times (the whole set, then again); ``--record DIR`` writes
every measurement to DIR/result.json for ``benchmarks.archive`` (docs/results/network.md's
tables: ``benchmarks.network_tables``).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import ipaddress
from pathlib import Path

from benchmarks.archive import record
from testbed import Testbed, load_topology_dict
from testbed.engine.core import down
from testbed.engine.planner import make_plan
from testbed.plan.actions import AddAddress, CreateBridge, CreateNetns, CreateVeth, ShapeEgress

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.helpers import star, star_of_stars  # noqa: E402

HTB = "root handle 1: htb default 1"
CLS = "parent 1: classid 1:1 htb rate {r}bit ceil {r}bit burst {b} cburst {b} quantum 60000"


def _batch(tool: str, lines: list[str], ns: str | None = None) -> None:
    with tempfile.NamedTemporaryFile("w", suffix=".batch", delete=False) as f:
        f.write("\n".join(lines) + "\n")
    argv = [tool] + (["-n", ns] if ns else []) + ["-batch", f.name]
    try:
        r = subprocess.run(argv, capture_output=True, text=True)
        if r.returncode:
            raise RuntimeError(f"{' '.join(argv)}: {r.stderr.strip()}")
    finally:
        os.unlink(f.name)


def topology(n: int, name: str) -> dict:
    # a Linux bridge holds at most 1023 ports: beyond that, leaves of 512 under a core switch
    return star(n, name=name, rate="1gbit") if n <= 1023 else star_of_stars(n, name=name, rate="1gbit")


def floor(n: int) -> tuple[float, float]:
    """The same kernel objects as testbed's plan, made by batched iproute2."""
    plan = make_plan(load_topology_dict(topology(n, "flr")), ipaddress.ip_network("10.9.0.0/16"))
    ip: dict[str, list[str]] = {}
    tc: dict[str, list[str]] = {}
    for a in plan.actions:
        if isinstance(a, CreateNetns):
            ip.setdefault(a.ns, []).append("link set lo up")
        elif isinstance(a, CreateBridge):
            ip[a.ns] += [f"link add {a.ifname} type bridge", f"link set {a.ifname} up"]
        elif isinstance(a, CreateVeth):
            master = f" master {a.master}" if a.master else ""
            where = f" netns {a.peer_ns}" if a.peer_ns != a.ns else ""
            ip[a.ns].append(f"link add {a.ifname}{master} up type veth peer name {a.peer_ifname}{where}")
            if a.peer_master:
                ip[a.ns].append(f"link set {a.peer_ifname} master {a.peer_master} up")
        elif isinstance(a, AddAddress):
            ip[a.ns] += [f"addr add {a.address}/{a.prefixlen} dev {a.ifname}", f"link set {a.ifname} up"]
        elif isinstance(a, ShapeEgress):
            cls = CLS.format(r=a.shape.rate.bps, b=max(15000, a.shape.rate.bytes_per_second // 1000))
            tc.setdefault(a.ns, []).extend([f"qdisc add dev {a.ifname} {HTB}", f"class add dev {a.ifname} {cls}"])
    fabric = plan.namespaces[0]
    t0 = time.perf_counter()
    _batch("ip", [f"netns add {ns}" for ns in plan.namespaces])
    _batch("ip", ip[fabric], ns=fabric)  # veths first: worker batches configure their ends
    for ns in plan.namespaces[1:]:
        _batch("ip", ip[ns], ns=ns)
        _batch("tc", tc[ns], ns=ns)
    _batch("tc", tc[fabric], ns=fabric)
    t_up = time.perf_counter() - t0
    t0 = time.perf_counter()
    _batch("ip", [f"netns del {ns}" for ns in reversed(plan.namespaces)])
    return t_up, time.perf_counter() - t0


def testbed_times(n: int) -> tuple[float, float]:
    topo = load_topology_dict(topology(n, "bench"))
    t0 = time.perf_counter()
    tb = Testbed.up(topo)
    t_up = time.perf_counter() - t0
    assert tb.exec(f"w{n - 1}", ["ping", "-c1", "-W2", tb.address("w0")], stdout=subprocess.DEVNULL).returncode == 0
    t0 = time.perf_counter()
    down("bench")
    return t_up, time.perf_counter() - t0


def docker_floor(n: int) -> tuple[float, float]:
    """The same containers as `up` makes (image, network none, init, shm, labels), SDK only."""
    from testbed.nodes.docker.backend import DEFAULT_IMAGE, DEFAULT_SHM
    from testbed.nodes.docker.api import client

    dc = client()
    t0 = time.perf_counter()
    made = [dc.containers.run(DEFAULT_IMAGE, name=f"floor-w{i}", hostname=f"w{i}", network_mode="none",
                              entrypoint=["sleep", "infinity"], init=True, detach=True, shm_size=DEFAULT_SHM,
                              labels={"testbed": "floor", "testbed.node": f"w{i}"}) for i in range(n)]
    for c in made:
        c.reload()  # up reads each container's pid: the same round trip
    t_up = time.perf_counter() - t0
    t0 = time.perf_counter()
    for c in made:
        c.remove(force=True, v=True)
    return t_up, time.perf_counter() - t0


def docker_times(n: int) -> tuple[float, float]:
    d = star(n, name="dbench", rate="1gbit")
    d["defaults"]["backend"] = "docker"
    t0 = time.perf_counter()
    tb = Testbed.up(load_topology_dict(d))
    t_up = time.perf_counter() - t0
    assert tb.exec(f"w{n - 1}", ["ping", "-c1", "-W2", tb.address("w0")], stdout=subprocess.DEVNULL).returncode == 0
    t0 = time.perf_counter()
    down("dbench")
    return t_up, time.perf_counter() - t0


def vm_floor(accel: str) -> float:
    """The guest kernel booting to its initramfs and powering off (no overlay, no agent)."""
    from testbed.nodes.vm import image as vmimage
    from testbed.nodes.vm.accel import QEMU, TCG_CPU, tcg_clock_args

    img = vmimage.current()
    cpu = ["-accel", "kvm", "-cpu", "host"] if accel == "kvm" else ["-accel", "tcg", "-cpu", TCG_CPU]
    argv = [QEMU, "-M", "microvm,pit=on,pic=on,rtc=on", *cpu, "-m", "2048", "-nodefaults", "-no-user-config",
            "-nographic", "-serial", "stdio", "-kernel", img["kernel"], "-initrd", img["initrd"],
            "-append", "console=ttyS0 panic=-1 quiet tb.probe=1" + (tcg_clock_args() if accel == "tcg" else "")]
    t0 = time.perf_counter()
    r = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert "probe ok" in r.stdout, r.stdout[-500:]
    return time.perf_counter() - t0


def vm_times(n: int) -> tuple[float, float, str]:
    from testbed.nodes.vm import image as vmimage
    from testbed.nodes.vm.accel import choose_accel

    img = vmimage.current()
    accel, _ = choose_accel("auto", img["kernel"], img["initrd"])
    d = star(n, name="vbench", rate="1gbit")
    d["defaults"]["backend"] = "vm"
    t0 = time.perf_counter()
    tb = Testbed.up(load_topology_dict(d))
    t_up = time.perf_counter() - t0
    assert tb.exec(f"w{n - 1}", ["ping", "-c1", "-W2", tb.address("w0")], stdout=subprocess.DEVNULL).returncode == 0
    t0 = time.perf_counter()
    down("vbench")
    return t_up, time.perf_counter() - t0, accel


def _timed(argv: list[str], cwd: str) -> float:
    t = time.perf_counter()
    r = subprocess.run(argv, capture_output=True, text=True, cwd=cwd)
    if r.returncode:
        raise RuntimeError(f"{' '.join(argv)}: {r.stderr.strip()[-500:]}")
    return time.perf_counter() - t


def rootless_times(n: int, user: str) -> tuple[float, float, float, float]:
    """(root up, root down, rootless up, rootless down) of the same star, as commands."""
    import pwd
    import yaml

    home = pwd.getpwnam(user).pw_dir
    exe = str(Path(sys.executable).with_name("testbed"))
    d = tempfile.mkdtemp(prefix="testbed-bench-rl-")
    os.chmod(d, 0o755)
    f = Path(d) / f"rl{n}.yaml"
    f.write_text(yaml.safe_dump(topology(n, f"rl{n}")))
    f.chmod(0o644)
    as_user = ["runuser", "-u", user, "--", "env", "-i", f"HOME={home}", "PATH=/usr/bin:/bin", exe]
    ru = _timed([exe, "up", str(f)], d)
    rd = _timed([exe, "down", f"rl{n}"], d)
    time.sleep(1.0)
    uu = _timed([*as_user, "up", str(f)], home)
    ud = _timed([*as_user, "down", f"rl{n}"], home)
    return ru, rd, uu, ud


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="8,64,256,1024")
    ap.add_argument("--docker-sizes", default="8,32", help="container workers ('' to skip)")
    ap.add_argument("--vm-sizes", default="1,4", help="VM workers booting in parallel ('' to skip)")
    ap.add_argument("--rootless-user", default=None, help="an ordinary user for the rootless row (none: skipped)")
    ap.add_argument("--rootless-sizes", default="8,64,256")
    ap.add_argument("--repeats", type=int, default=1, help="measure every row this many times, taking turns")
    ap.add_argument("--record", type=Path, metavar="DIR", help="write every measurement to DIR/result.json")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("needs root")
    if args.repeats < 1:
        sys.exit("--repeats: at least 1")
    os.environ.setdefault("TESTBED_STATE_DIR", tempfile.mkdtemp(prefix="testbed-bench-"))
    rows: list[dict] = []
    for k in range(args.repeats):
        rows += [dict(r, repeat=k) for r in _one_pass(args)]
    if args.record:
        print(f"recorded: {record(args.record, 'up_down', rows)}")


def _sizes(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _one_pass(args: argparse.Namespace) -> list[dict]:
    """Every row once, printed as measured; the rows as records."""
    rows = []
    print(f"{'workers':>7} {'up (s)':>8} {'floor up':>9} {'up/floor':>9} {'down (s)':>9} {'floor down':>11} {'down/floor':>11}")
    for n in _sizes(args.sizes):
        fu, fd = floor(n)
        tu, td = testbed_times(n)
        rows.append({"kind": "star", "workers": n, "up_s": tu, "floor_up_s": fu, "down_s": td, "floor_down_s": fd})
        print(f"{n:7d} {tu:8.3f} {fu:9.3f} {tu / fu:9.2f} {td:9.3f} {fd:11.3f} {td / fd:11.2f}", flush=True)
        time.sleep(1.0)  # let the kernel finish freeing the namespaces (cleanup_net is asynchronous)
    if _sizes(args.docker_sizes):
        print(f"{'docker':>7} {'up (s)':>8} {'SDK up':>9} {'up/SDK':>9} {'down (s)':>9} {'SDK down':>11} {'down/SDK':>11}")
    for n in _sizes(args.docker_sizes):
        fu, fd = docker_floor(n)
        tu, td = docker_times(n)
        rows.append({"kind": "docker", "workers": n, "up_s": tu, "floor_up_s": fu, "down_s": td, "floor_down_s": fd})
        print(f"{n:7d} {tu:8.3f} {fu:9.3f} {tu / fu:9.2f} {td:9.3f} {fd:11.3f} {td / fd:11.2f}", flush=True)
    if _sizes(args.vm_sizes):
        print(f"{'VMs':>7} {'up (s)':>8} {'per VM':>9} {'kernel':>9} {'up/kernel':>10} {'down (s)':>9}  accel")
    for n in _sizes(args.vm_sizes):
        tu, td, accel = vm_times(n)
        fk = vm_floor(accel)
        rows.append({"kind": "vm", "workers": n, "up_s": tu, "floor_up_s": fk, "down_s": td, "accel": accel})
        print(f"{n:7d} {tu:8.3f} {tu / n:9.3f} {fk:9.3f} {tu / fk:10.2f} {td:9.3f}  {accel}", flush=True)
    if args.rootless_user:
        print(f"{'rootless':>8} {'root up':>8} {'user up':>8} {'user/root':>9} {'root down':>10} {'user down':>10} "
              f"{'user/root':>9}")
        for n in _sizes(args.rootless_sizes):
            ru, rd, uu, ud = rootless_times(n, args.rootless_user)
            rows.append({"kind": "rootless", "workers": n, "root_up_s": ru, "root_down_s": rd, "user_up_s": uu,
                         "user_down_s": ud})
            print(f"{n:8d} {ru:8.3f} {uu:8.3f} {uu / ru:9.2f} {rd:10.3f} {ud:10.3f} {ud / rd:9.2f}", flush=True)
            time.sleep(1.0)
    return rows


if __name__ == "__main__":
    main()
