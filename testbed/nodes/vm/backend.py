"""The vm backend: a worker is a QEMU virtual machine with its own kernel.

On the host each VM worker has a network namespace like a netns worker's, named the same
way and holding the same ``eth0`` (the worker end of its link, shaped with the same HTB
tree, counted by the same exporter, changed by the same ``link set``). Next to it sit a
bridge ``vmbr0`` and a tap ``vmtap0``: the VM's NIC. So the tap plays the veth end's role
and nothing outside this module knows a VM is there; the guest's ``eth0`` carries the
worker's address. QEMU itself runs inside that namespace, so the port it forwards for
the guest agent (QEMU user networking, :mod:`testbed.nodes.vm.agent`) exists only on that
namespace's loopback.

The guest (:mod:`testbed.nodes.vm.image`) boots Debian's kernel with a busybox initramfs into a
copy-on-write overlay of the host's root filesystem (virtio-9p, read-only), so ranks run
the host's own Python, torch and testbed at the same paths. Run directories reach the
host through a second, writable share, bind-mounted per command.

Acceleration: ``accel: kvm`` (a host with working KVM), ``tcg`` (software emulation:
works everywhere, slow: about 40 s to import torch), ``auto`` (default: KVM if a test
guest boots with it on this host, else TCG with a warning). ``gpu_pci:`` passes a host
PCI device (bound to vfio-pci) through to the guest; checked at ``up``, never tested
here (no GPU host with VFIO was available).

Faults: a guest whose agent does not answer after boot fails ``up`` naming its node
(:mod:`testbed.nodes.vm.proc`); one that goes silent while a command runs there is given up
after ``TESTBED_VM_HANG_TIMEOUT`` seconds (:mod:`testbed.nodes.vm.relay`); ``down`` returns
once QEMU has exited, or names the QEMU that SIGKILL did not end.
"""

from __future__ import annotations

import functools
import json
import os
import secrets
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from testbed.common import procs
from testbed.plan.actions import ApplyContext, Action, CreateNetns, Teardown, register
from testbed.common.errors import TestbedError
from testbed.nodes.vm.image import AGENT_PORT
from testbed.model.backend_options import DEFAULT_MEMORY, DEFAULT_VCPUS, mem_mb as _mem_mb
from testbed.nodes.vm import image as vmimage
from testbed.nodes.base import Backend, Check
from testbed.nodes.vm.accel import QEMU, TCG_CPU, choose_accel, known_kvm, tcg_clock_args
from testbed.nodes.vm import proc as vmproc
from testbed.nodes.vm.proc import AwaitVMs, forget_vms, remove_vm_dir, vm_dir  # noqa: F401  (AwaitVMs: registered)
from testbed.nodes.vm.qemu import hang_timeout, marker, qemu_pids  # noqa: F401  (qemu_pids: this backend's API)

BRIDGE, TAP = "vmbr0", "vmtap0"
TUNSETIFF, TUNSETPERSIST, IFF_TAP, IFF_NO_PI, IFF_VNET_HDR = 0x400454CA, 0x400454CB, 0x0002, 0x1000, 0x4000


def create_tap(ns: str, ifname: str) -> None:
    """A persistent tap ``ifname`` in namespace ``ns`` (made on the namespace thread:
    /dev/net/tun creates in the caller's namespace, which netlink cannot choose)."""
    import fcntl
    import struct

    from testbed.net import netns

    def make():
        fd = os.open("/dev/net/tun", os.O_RDWR)
        try:
            fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", ifname.encode(), IFF_TAP | IFF_NO_PI | IFF_VNET_HDR))
            fcntl.ioctl(fd, TUNSETPERSIST, 1)
        finally:
            os.close(fd)

    try:
        netns.call_in(ns, make)
    except OSError as e:
        raise TestbedError(f"[{ns}] creating tap {ifname}: {e}", "VM workers need /dev/net/tun (modprobe tun)") from None


@register
@dataclass(frozen=True)
class CreateVmNic(Action):
    """The VM's NIC on the host: bridge ``vmbr0`` with tap ``vmtap0`` in node namespace ``ns``
    (the worker's link end joins the bridge when it is created)."""

    ns: str

    def describe(self) -> str:
        return f"[{self.ns}] bridge {BRIDGE} + tap {TAP} (the VM's NIC)"

    def apply(self, ctx: ApplyContext) -> None:
        rt = ctx.host.rtnl(self.ns)
        rt.add_bridge(BRIDGE, False)
        create_tap(self.ns, TAP)
        rt.set_master_up(TAP, BRIDGE)

    # goes with the namespace (CreateNetns before it)


@register
@dataclass(frozen=True)
class StartVM(Action):
    """Boot the worker's VM: QEMU inside node namespace ``ns``, state under ``dir``."""

    ns: str
    node: str
    dir: str
    address: str
    kernel: str
    initrd: str
    accel: str
    vcpus: int = DEFAULT_VCPUS
    memory: str = DEFAULT_MEMORY
    sysctls: tuple = ()
    gpu_pci: str | None = None
    python: str = ""

    def describe(self) -> str:
        return (f"[{self.ns}] VM {self.node}: qemu ({self.accel}, {self.vcpus} vCPU, {self.memory}) "
                f"on {TAP}, {self.address}")

    def _check(self) -> Path:
        from testbed.common.state import state_root
        from testbed.plan import naming

        d = Path(self.dir)
        if d.parent != state_root() / "vm" or d.name != self.ns or "." not in self.ns or \
                not naming.owned_namespace(self.ns.split(".", 1)[0], self.ns):
            raise TestbedError(f"VM state directory {self.dir!r} is not one testbed makes; left alone")
        return d

    def argv(self, accel: str) -> list[str]:
        d = Path(self.dir)
        mb = _mem_mb(self.memory)
        append = (f"console=ttyS0 panic=-1 quiet tb.addr={self.address} tb.dmac={_mac(self.ns, 0)} "
                  f"tb.mmac={_mac(self.ns, 1)} tb.host={self.node} tb.tmpfs={max(mb // 2, 256)}m "
                  f"tb.python={self.python} tb.cfg={d / 'agent.json'}")
        cpu = ["-accel", "kvm", "-cpu", "host"] if accel == "kvm" else ["-accel", "tcg", "-cpu", TCG_CPU]
        if accel == "tcg":
            append += tcg_clock_args()
        argv = [QEMU, "-name", marker(self.ns), "-M", "microvm,pit=on,pic=on,rtc=on", *cpu,
                "-smp", str(self.vcpus), "-m", f"{mb}M", "-nodefaults", "-no-user-config", "-nographic",
                "-serial", f"file:{d / 'console.log'}", "-kernel", self.kernel, "-initrd", self.initrd,
                "-append", append,
                "-fsdev", "local,id=tbroot,path=/,security_model=none,multidevs=remap,readonly=on",
                "-device", "virtio-9p-device,fsdev=tbroot,mount_tag=tbroot",
                "-fsdev", "local,id=tbhost,path=/,security_model=none,multidevs=remap",
                "-device", "virtio-9p-device,fsdev=tbhost,mount_tag=tbhost",
                "-netdev", f"tap,id=data,ifname={TAP},script=no,downscript=no",
                "-device", f"virtio-net-device,netdev=data,mac={_mac(self.ns, 0)}",
                "-netdev", f"user,id=mgmt,restrict=on,hostfwd=tcp:127.0.0.1:{AGENT_PORT}-10.0.2.15:{AGENT_PORT}",
                "-device", f"virtio-net-device,netdev=mgmt,mac={_mac(self.ns, 1)}"]
        if self.gpu_pci:
            argv += ["-device", f"vfio-pci,host={self.gpu_pci}"]
        return argv

    def apply(self, ctx: ApplyContext) -> None:
        d = self._check()
        if d.exists():
            shutil.rmtree(d)
        d.mkdir(mode=0o700, parents=True)
        token = d / "token"
        fd = os.open(token, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32) + "\n")
        (d / "agent.json").write_text(json.dumps({"token_file": str(token), "port": AGENT_PORT,
                                                  "sysctls": [kv.split("=", 1) for kv in self.sysctls]}))
        accel, warning = choose_accel(self.accel, self.kernel, self.initrd)
        if warning:
            _warn_once(warning)
        argv = procs.python_argv("testbed.nodes.nsexec", self.ns, "--", *self.argv(accel))
        with open(d / "qemu.log", "ab") as log:
            subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             start_new_session=True, close_fds=True)

    def release(self, td: Teardown) -> None:
        try:
            self._check()
        except TestbedError as e:
            td.problems.append(e.message)
            return
        vmproc.stop_qemu(self.ns)  # returns once QEMU has exited, or names it

    def undo(self, td: Teardown) -> None:
        try:
            d = self._check()
        except TestbedError:
            return
        remove_vm_dir(d)


def _mac(ns: str, nic: int) -> str:
    import hashlib

    h = hashlib.sha256(f"{ns}/{nic}".encode()).digest()
    return "52:54:%02x:%02x:%02x:%02x" % (nic, h[0], h[1], h[2])


# ---------------------------------------------------------------------- backend


class VmBackend(Backend):
    name = "vm"
    needs_root = ("QEMU workers are not built rootless (their NICs are taps, made through /dev/net/tun, and "
                  "their guest kernel cache is root's)")
    host_address = False  # the guest's eth0 carries the address
    node_master = BRIDGE  # the link's end joins the bridge with the VM's tap
    shares_host_gpus = False  # a VM sees only a GPU passed through to it


    # ------------------------------------------------------------- host-wide duties
    def checks(self) -> list[Check]:
        return _host_checks()

    def build_image(self, say, force: bool = False, kernel: Path | None = None, **_) -> dict:
        return vmimage.build(say=say, force=force, kernel=kernel)

    def forget(self, namespaces: Sequence[str]) -> None:
        forget_vms(namespaces)  # QEMU lives in its node's namespace (stopped already)

    def preflight(self, nodes: Sequence) -> None:
        if shutil.which(QEMU) is None:
            raise TestbedError(f"backend vm needs {QEMU}", "apt-get install qemu-system-x86")
        if not os.path.exists("/dev/net/tun"):
            raise TestbedError("backend vm needs /dev/net/tun", "modprobe tun")
        if any("kernel" not in dict(n.options) for n in nodes):
            ok, detail = vmimage.status()
            if not ok:
                raise TestbedError(f"the VM guest is not built: {detail}", "run `testbed image build --vm` once")
        for k in dict.fromkeys(dict(n.options).get("kernel") for n in nodes):
            if k:  # its own initramfs (its modules), built now and cached
                user = next(n.name for n in nodes if dict(n.options).get("kernel") == k)
                try:
                    _guest(k)
                except TestbedError as e:
                    raise TestbedError(f"node {user}: {e.message}", e.hint) from None
        for n in nodes:
            g = dict(n.options).get("gpu_pci")
            if g:
                drv = Path(f"/sys/bus/pci/devices/{g}/driver")
                if not drv.exists() or drv.resolve().name != "vfio-pci":
                    raise TestbedError(f"node {n.name}: gpu_pci {g} is not bound to vfio-pci",
                                       "bind it first (driverctl set-override ADDRESS vfio-pci), with the IOMMU on")

    def plan_node(self, testbed: str, node, ns: str, tag: str, address: str, sysctls: tuple) -> list:
        o = dict(node.options)
        img = _guest(o.get("kernel"))
        return [CreateNetns(ns, tag), CreateVmNic(ns),
                StartVM(ns, node.name, str(vm_dir(ns)), address, img["kernel"], img["initrd"],
                        o.get("accel", "auto"),
                        o.get("vcpus", DEFAULT_VCPUS), o.get("memory", DEFAULT_MEMORY),
                        tuple(f"{k}={v}" for k, v in sysctls), o.get("gpu_pci"), sys.executable)]

    def plan_ready(self, infos: Sequence) -> list:
        pairs: list[str] = []
        for info in infos:
            pairs += [info.netns, str(vm_dir(info.netns))]
        return [AwaitVMs(tuple(pairs))] if pairs else []

    # ------------------------------------------------------------------ processes
    def _relay(self, info, *args: str) -> list[str]:
        """The relay to the guest's agent, which takes the guest for hung after
        ``TESTBED_VM_HANG_TIMEOUT`` s without a word from it (:mod:`testbed.nodes.vm.relay`)."""
        return procs.python_argv("testbed.nodes.vm.relay", info.netns, "--dir", str(vm_dir(info.netns)),
                                 "--node", info.name, "--hang-timeout", f"{hang_timeout():g}", *args)

    def command(self, info, argv: Sequence[str], *, mounts: Sequence[Path] = (), cwd: Path | None = None) -> list[str]:
        args: list[str] = []
        for m in mounts:
            args += ["--mount", str(Path(m).resolve())]
        if cwd is not None:
            args += ["--cwd", str(Path(cwd).resolve())]
        return self._relay(info, *args, "--", *argv)

    def python(self, info) -> str:
        return sys.executable  # the guest runs the host's interpreter (its root is the host's, copy-on-write)

    def own_gpu(self, node) -> bool:
        return bool(dict(node.options).get("gpu_pci"))  # passed through: the guest's only GPU

    def cuda_visible(self, info, gpu: int | None) -> str:
        # the guest sees the GPU passed through to it (gpu_pci:) and no other, as its GPU 0; a
        # host index would hide it, and a VM without one has none to show
        return "0" if info.own_gpu else ""

    def environment(self, info) -> dict[str, str]:
        keep = ("PATH", "LANG", "LC_ALL", "TZ", "PYTHONHASHSEED", "VIRTUAL_ENV")
        env = {k: os.environ[k] for k in keep if k in os.environ}
        env.setdefault("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
        env["HOME"] = "/root"
        return env

    def why_stopped(self, info) -> str | None:
        return vmproc.why_stopped(info.netns)

    def stop(self, info) -> None:
        from testbed.nodes.vm.relay import request

        try:
            request(info.netns, vm_dir(info.netns), "stop", timeout=30.0)
        except (OSError, RuntimeError, ValueError, KeyError, TestbedError) as e:
            raise TestbedError(f"node {info.name}: stopping its processes failed: {e}") from None

    # ------------------------------------------------------------------ files
    def put(self, info, src: Path, dst: str) -> None:
        code = "import shutil, sys; shutil.copyfileobj(sys.stdin.buffer, open(sys.argv[1], 'wb'))"
        with open(src, "rb") as f:
            r = subprocess.run(self.command(info, [sys.executable, "-c", code, dst]), stdin=f,
                               capture_output=True)
        if r.returncode != 0:
            raise TestbedError(f"node {info.name}: copying {src} to {dst} failed: "
                               f"{r.stderr.decode(errors='replace').strip()[-300:]}")

    def get(self, info, src: str, dst: Path) -> None:
        code = "import shutil, sys; shutil.copyfileobj(open(sys.argv[1], 'rb'), sys.stdout.buffer)"
        with open(dst, "wb") as f:
            r = subprocess.run(self.command(info, [sys.executable, "-c", code, src]), stdout=f,
                               stderr=subprocess.PIPE)
        if r.returncode != 0:
            raise TestbedError(f"node {info.name}: cannot read {src}: "
                               f"{r.stderr.decode(errors='replace').strip()[-300:]}")


def _guest(kernel: str | None) -> dict:
    """Kernel and initramfs of VM workers with ``kernel:`` (None: the default)."""


    return _guest_of(kernel) if kernel else vmimage.current()


@functools.lru_cache(maxsize=None)
def _guest_of(kernel: str) -> dict:
    """A topology's kernel: its initramfs is checked (built if need be) once per process,
    not once per worker (each check reads and hashes every module)."""


    return vmimage.build(kernel=Path(kernel))


_WARNED: set[str] = set()


def _warn_once(msg: str) -> None:
    if msg not in _WARNED:
        _WARNED.add(msg)
        print(f"warning: {msg}", file=sys.stderr)


def _host_checks() -> list[Check]:
    """What backend: vm needs: QEMU and the guest; and whether KVM runs it."""
    qemu = shutil.which(QEMU)
    out = [Check("qemu (backend: vm)", bool(qemu), qemu or "not found",
                 None if qemu else "apt-get install qemu-system-x86 (only for the vm backend)")]
    ok, detail = vmimage.status()
    out.append(Check("VM guest", ok, detail, None if ok else "`sudo $(command -v testbed) image build --vm` (only for the vm backend)"))
    kvm = known_kvm()
    if kvm is None:
        kvm = (os.access("/dev/kvm", os.R_OK | os.W_OK), "/dev/kvm accessible; not yet tried with a guest "
               "(the first `up` with VM workers does)" if os.path.exists("/dev/kvm") else "/dev/kvm missing")
    out.append(Check("KVM for VM workers", kvm[0], kvm[1],
                     None if kvm[0] else "VM workers fall back to TCG (software emulation, much slower)"))
    return out
