"""The guest of ``backend: vm``: a Debian kernel and a busybox initramfs, built offline.

No root filesystem image is built. The guest boots into an overlay whose lower layer is
the host's own root filesystem, shared read-only over virtio-9p, and whose upper layer is
a tmpfs of the guest: every VM is copy-on-write over the host, the base is never written,
and the guest runs the very Python, torch and testbed the host runs, at the same paths
(nothing to build or keep in step, against about 2 minutes and 1.24 GB for the
debootstrap + torch image of the docker backend; see README "VM workers"). The host directories a command must
write (a run directory) are bind-mounted in the guest from a second, writable share.

The kernel is Debian's ``linux-image-<abi>-amd64`` (the generic flavour: the cloud one has
no 9p), fetched with ``apt-get download`` and unpacked with ``dpkg-deb -x`` (never
installed on the host). The initramfs holds busybox (``busybox-static``), the modules the
guest needs (virtio-mmio, virtio-net, 9p, overlay, and the qdiscs and links testbed itself
may create inside a guest: htb, netem, veth, bridge), in dependency order, and ``/init``
(:data:`INIT`). Both are cached under ``$TESTBED_VM_CACHE`` (default
/var/cache/testbed/vm), keyed by kernel ABI and content.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import shutil
import stat
import tempfile
import time
from pathlib import Path
from typing import Callable

from testbed.common.errors import TestbedError
from testbed.common.owners import make_dirs
from testbed.common.procs import run_tool

CACHE_ENV = "TESTBED_VM_CACHE"
KERNEL_ENV = "TESTBED_VM_KERNEL"
BUSYBOX = "/bin/busybox"
MODULES = ("virtio_mmio", "virtio_net", "9pnet_virtio", "9p", "overlay", "sch_htb", "sch_netem", "sch_ingress",
           "sch_tbf", "sch_fq_codel", "veth", "bridge", "tun")
AGENT_PORT = 7000
"""The guest agent's TCP port on the management NIC (QEMU user networking, forwarded to
127.0.0.1 inside the node's own network namespace on the host)."""

INIT = r"""#!/bin/busybox sh
# testbed guest init: modules, the host's root as a copy-on-write overlay, the NICs, then
# the agent as a child of this shell (which stays PID 1 and powers off when it exits).
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for m in $(cat /modules.order); do insmod /lib/modules/$m 2>/dev/null; done
CMDLINE=$(cat /proc/cmdline)
arg() { for w in $CMDLINE; do case "$w" in "$1="*) echo "${w#*=}";; esac; done; }
[ -n "$(arg tb.probe)" ] && { echo "testbed-init: probe ok" > /dev/console; poweroff -f; }
fail() { echo "testbed-init: $*" >&2; echo "testbed-init: FAILED" > /dev/console; poweroff -f; }
mkdir -p /lower /upper /newroot
mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=524288,cache=loose tbroot /lower || fail "9p root"
mount -t tmpfs -o size=$(arg tb.tmpfs) tmpfs /upper || fail tmpfs
mkdir -p /upper/u /upper/w
mount -t overlay overlay -o lowerdir=/lower,upperdir=/upper/u,workdir=/upper/w /newroot || fail overlay
for d in proc sys dev; do mount --move /$d /newroot/$d; done
mount -t tmpfs -o mode=755 tmpfs /newroot/run
mkdir -p /newroot/run/testbed-host /newroot/run/netns
mount -t 9p -o trans=virtio,version=9p2000.L,msize=524288 tbhost /newroot/run/testbed-host || fail "9p host"
mkdir -p /newroot/dev/shm /newroot/dev/pts && mount -t tmpfs tmpfs /newroot/dev/shm
for n in /newroot/sys/class/net/*; do
  mac=$(cat $n/address); dev=${n##*/}
  [ "$mac" = "$(arg tb.dmac)" ] && ip link set "$dev" name eth0
  [ "$mac" = "$(arg tb.mmac)" ] && ip link set "$dev" name mgmt0
done
ip link set lo up
ip link set mgmt0 up && ip addr add 10.0.2.15/24 dev mgmt0 || fail mgmt0
ip link set eth0 up && ip addr add $(arg tb.addr) dev eth0 || fail eth0
hostname $(arg tb.host)
echo "testbed-init: up" > /dev/console
chroot /newroot $(arg tb.python) -P -m testbed.nodes.vm.agent $(arg tb.cfg)
echo "testbed-init: agent exited ($?)" > /dev/console
sync
poweroff -f
"""


def cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV, "/var/cache/testbed/vm"))


def _kernel_package() -> str:
    """The generic kernel package to fetch: the newest ``linux-image-<abi>-amd64`` that
    the metapackage ``linux-image-amd64`` points at."""
    if shutil.which("apt-cache") is None:
        raise TestbedError("no apt-cache: the default guest kernel comes from Debian's archive",
                           f"give a kernel yourself: {KERNEL_ENV}=DIR holding vmlinuz and lib/modules/")
    out = run_tool(["apt-cache", "depends", "linux-image-amd64"], "apt-cache depends linux-image-amd64").stdout
    m = re.search(r"Depends:\s*(linux-image-[0-9][0-9.\-]*-amd64)\b", out)
    if not m:
        raise TestbedError("cannot tell which kernel linux-image-amd64 depends on", "apt-get update, then retry")
    return m.group(1)


def check_kernel_dir(d: Path, what: str) -> Path:
    """``d`` holds ``vmlinuz`` and one ``lib/modules/<abi>/`` (an unpacked kernel package)."""
    if not (d / "vmlinuz").is_file() or len(list((d / "lib" / "modules").glob("*"))) != 1:
        raise TestbedError(f"{what} {d} has no vmlinuz and one lib/modules/<version>/",
                           "point it at an unpacked kernel package (dpkg-deb -x linux-image-....deb DIR; "
                           "mv DIR/boot/vmlinuz-* DIR/vmlinuz)")
    return d


def kernel_dir(say: Callable[[str], None] = lambda m: None) -> Path:
    """A directory with ``vmlinuz`` and ``lib/modules/<abi>/``: $TESTBED_VM_KERNEL, or
    Debian's generic kernel unpacked into the cache (fetched once)."""
    given = os.environ.get(KERNEL_ENV)
    if given:
        return check_kernel_dir(Path(given), KERNEL_ENV)
    pkg = _kernel_package()
    d = cache_dir() / pkg
    if (d / ".complete").exists():
        return d
    make_dirs(cache_dir(), CACHE_ENV)
    tmp = Path(tempfile.mkdtemp(prefix="kernel-", dir=cache_dir()))
    try:
        say(f"apt-get download {pkg}")
        t = time.monotonic()
        run_tool(["apt-get", "download", "-q", pkg], f"apt-get download {pkg}", cwd=tmp)
        deb = next(tmp.glob("*.deb"))
        run_tool(["dpkg-deb", "-x", str(deb), str(tmp / "x")], f"dpkg-deb -x {deb.name}")
        x = tmp / "x"
        vmlinuz = next((x / "boot").glob("vmlinuz-*"))
        vmlinuz.rename(x / "vmlinuz")
        (x / ".complete").write_text(pkg + "\n")
        if d.exists():
            shutil.rmtree(d)
        x.rename(d)
        say(f"kernel {pkg} unpacked in {time.monotonic() - t:.0f} s ({d})")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return d


_DEPENDS = re.compile(rb"(?:^|\0)depends=([A-Za-z0-9_,\-]*)\0")


def _module_index(moddir: Path) -> dict[str, Path]:
    index = {}
    for p in moddir.rglob("*.ko*"):
        name = p.name.split(".ko")[0].replace("-", "_")
        index[name] = p
    return index


def _read_module(p: Path) -> bytes:
    data = p.read_bytes()
    if p.name.endswith(".xz"):
        import lzma

        data = lzma.decompress(data)
    elif p.name.endswith(".zst"):
        raise TestbedError(f"{p} is zstd-compressed", "give an uncompressed or xz-compressed kernel's modules")
    return data


def module_order(moddir: Path, wanted=MODULES) -> list[tuple[str, bytes]]:
    """``wanted`` and what they depend on (from each module's ``depends=`` modinfo), as
    (name, contents), dependencies first. A wanted module built into the kernel is skipped."""
    index = _module_index(moddir)
    order: list[tuple[str, bytes]] = []
    seen: set[str] = set()

    def visit(name: str) -> None:
        name = name.replace("-", "_")
        if name in seen:
            return
        seen.add(name)
        p = index.get(name)
        if p is None:
            return  # built in
        data = _read_module(p)
        m = _DEPENDS.search(data)
        for dep in (m.group(1).decode().split(",") if m and m.group(1) else []):
            visit(dep)
        order.append((name, data))

    for w in wanted:
        visit(w)
    return order


def _cpio(entries: list[tuple[str, int, bytes]]) -> bytes:
    """A newc cpio archive of (path, mode, data); directories have empty data."""
    out = io.BytesIO()

    def put(name: str, mode: int, data: bytes, ino: int) -> None:
        nb = name.encode() + b"\0"
        hdr = "070701" + "".join(f"{v:08X}" for v in (ino, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(nb), 0))
        out.write(hdr.encode() + nb)
        out.write(b"\0" * (-(110 + len(nb)) % 4))
        out.write(data)
        out.write(b"\0" * (-len(data) % 4))

    for i, (name, mode, data) in enumerate(entries, start=1):
        put(name, mode, data, i)
    put("TRAILER!!!", 0, b"", 0)
    return out.getvalue()


def build(say: Callable[[str], None] = lambda m: None, force: bool = False, kernel: Path | None = None) -> dict:
    """Kernel and initramfs for VM workers (the default kernel, or ``kernel``: a directory
    as :func:`check_kernel_dir` wants); returns {"kernel", "initrd", "abi", "cached", "seconds"}."""
    t0 = time.monotonic()
    if not Path(BUSYBOX).is_file():
        raise TestbedError(f"{BUSYBOX} is missing (the guest's initramfs is busybox)", "apt-get install busybox-static")
    kd = check_kernel_dir(kernel, "kernel:") if kernel is not None else kernel_dir(say)
    make_dirs(cache_dir(), CACHE_ENV)
    abi = next((kd / "lib" / "modules").iterdir()).name
    busybox = Path(BUSYBOX).read_bytes()
    mods = module_order(kd / "lib" / "modules" / abi)
    key = hashlib.sha256(b"\0".join([INIT.encode(), busybox, *[n.encode() + d for n, d in mods]])).hexdigest()[:16]
    initrd = cache_dir() / f"initrd-{abi}-{key}.cpio"
    res = {"kernel": str(kd / "vmlinuz"), "initrd": str(initrd), "abi": abi, "modules": [n for n, _ in mods]}
    if initrd.exists() and not force:
        return {**res, "cached": True, "seconds": time.monotonic() - t0}
    d, x = stat.S_IFDIR | 0o755, stat.S_IFREG | 0o755
    entries = [("bin", d, b""), ("proc", d, b""), ("sys", d, b""), ("dev", d, b""), ("lib", d, b""),
               ("lib/modules", d, b""), ("bin/busybox", x, busybox), ("init", x, INIT.encode())]
    entries += [(f"lib/modules/{n}.ko", stat.S_IFREG | 0o644, data) for n, data in mods]
    entries.append(("modules.order", stat.S_IFREG | 0o644, "".join(f"{n}.ko\n" for n, _ in mods).encode()))
    tmp = initrd.with_suffix(".tmp")
    tmp.write_bytes(_cpio(entries))
    tmp.rename(initrd)
    say(f"initramfs {initrd.name}: busybox + {len(mods)} modules")
    return {**res, "cached": False, "seconds": time.monotonic() - t0}


def current() -> dict:
    """The kernel and initramfs ``build`` made last (no building, no network)."""
    found = sorted(cache_dir().glob("initrd-*.cpio"), key=lambda p: p.stat().st_mtime, reverse=True)
    given = os.environ.get(KERNEL_ENV)
    for initrd in found:  # the newest with the default kernel (a kernel: of a topology has its own)
        abi = initrd.name[len("initrd-"):].rsplit("-", 1)[0]
        kernels = [k for k in cache_dir().glob("linux-image-*/vmlinuz") if (k.parent / "lib" / "modules" / abi).is_dir()]
        if given:
            kernels = [Path(given) / "vmlinuz"] if (Path(given) / "lib" / "modules" / abi).is_dir() else []
        if kernels:
            return {"kernel": str(kernels[0]), "initrd": str(initrd), "abi": abi}
    raise TestbedError("the VM guest is not built", "run `testbed image build --vm` once")


def status() -> tuple[bool, str]:
    """Whether the guest kernel and initramfs are built (for `testbed doctor`)."""
    if not Path(BUSYBOX).is_file():
        return False, f"{BUSYBOX} missing (apt-get install busybox-static)"
    found = sorted(cache_dir().glob("initrd-*.cpio"))
    if not found:
        return False, "not built: `testbed image build --vm` (fetches Debian's kernel once)"
    return True, f"{found[-1].name} in {cache_dir()}"
