"""`testbed doctor`: what this machine can do, each missing piece with a hint."""

from __future__ import annotations

import os
import shutil
from dataclasses import asdict, dataclass


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    hint: str | None = None
    required: bool = False


def _cap_net_admin() -> bool:
    try:
        for line in open("/proc/self/status"):
            if line.startswith("CapEff:"):
                return bool(int(line.split()[1], 16) & (1 << 12))
    except OSError:
        pass
    return False


def run_checks() -> list[Check]:
    checks: list[Check] = []
    root = os.geteuid() == 0
    cap = _cap_net_admin()
    checks.append(Check("root / CAP_NET_ADMIN", root or cap,
                        "running as root" if root else ("CAP_NET_ADMIN held" if cap else "neither root nor CAP_NET_ADMIN"),
                        None if (root or cap) else "run testbed with sudo", required=True))
    kernel_hints = {
        "netns": ("kernel built without network namespaces (CONFIG_NET_NS)", True),
        "veth": ("load the veth module: modprobe veth", True),
        "bridge": ("load the bridge module: modprobe bridge", True),
        "htb": ("load sch_htb: modprobe sch_htb", True),
        "tbf": ("load sch_tbf: modprobe sch_tbf (not needed by testbed itself)", False),
        "netem": ("delay, jitter and loss need sch_netem: modprobe sch_netem (package linux-modules-extra-$(uname -r) "
                  "on Ubuntu); bandwidth shaping works without it", False),
    }
    if root or cap:
        from testbed.common.errors import TestbedError
        from testbed.net.probe import probe

        try:
            res = probe()
        except TestbedError as e:
            res = {k: (False, str(e)) for k in kernel_hints}
        for k, (hint, required) in kernel_hints.items():
            ok, detail = res.get(k, (False, "not probed"))
            if k == "netem" and not ok:
                hint += ("; or run what needs netem inside a VM worker, whose guest kernel has it "
                         "(backend: vm; tests/kernel/test_vm.py runs the netem tests that way)")
            checks.append(Check(k, ok, detail, None if ok else hint, required))
    else:
        for k, (hint, required) in kernel_hints.items():
            checks.append(Check(k, False, "not probed (needs root)", "run `sudo testbed doctor`", required))

    checks.append(_docker())
    from testbed.nodes.images import DEFAULT_TAG, status as image_status

    ok, detail = image_status(DEFAULT_TAG)
    checks.append(Check("worker image", ok, detail,
                        None if ok else "`sudo testbed image build` (offline; only for the docker backend)"))
    checks.extend(_vm())
    prom = shutil.which("prometheus")
    checks.append(Check("prometheus binary", bool(prom), prom or "not found",
                        None if prom else "apt-get install prometheus (needed by `testbed monitor`)"))
    iperf = shutil.which("iperf3")
    checks.append(Check("iperf3", bool(iperf), iperf or "not found",
                        None if iperf else "apt-get install iperf3 (fidelity tests and benchmarks)"))
    checks.extend(_gpu())
    return checks


def _docker() -> Check:
    sock = "/var/run/docker.sock"
    try:
        import docker  # type: ignore

        try:
            client = docker.from_env(timeout=3)
            v = client.version().get("Version", "?")
            return Check("docker engine", True, f"engine {v} answers on {sock}")
        except Exception as e:  # the SDK raises many types; all mean "not usable"
            return Check("docker engine", False, f"not reachable: {type(e).__name__}",
                         "apt-get install docker.io and start dockerd (only for the docker backend)")
    except ImportError:
        ok = os.path.exists(sock)
        return Check("docker engine", ok, f"socket {sock} {'present' if ok else 'absent'} (docker SDK not installed)",
                     None if ok else "apt-get install docker.io and start dockerd (only for the docker backend)")


def _vm() -> list[Check]:
    """What backend: vm needs: QEMU and the guest; and whether KVM runs it."""
    from testbed.nodes import vmimage
    from testbed.nodes.vm import QEMU, known_kvm

    qemu = shutil.which(QEMU)
    out = [Check("qemu (backend: vm)", bool(qemu), qemu or "not found",
                 None if qemu else "apt-get install qemu-system-x86 (only for the vm backend)")]
    ok, detail = vmimage.status()
    out.append(Check("VM guest", ok, detail, None if ok else "`sudo testbed image build --vm` (only for the vm backend)"))
    kvm = known_kvm()
    if kvm is None:
        kvm = (os.access("/dev/kvm", os.R_OK | os.W_OK), "/dev/kvm accessible; not yet tried with a guest "
               "(the first `up` with VM workers does)" if os.path.exists("/dev/kvm") else "/dev/kvm missing")
    out.append(Check("KVM for VM workers", kvm[0], kvm[1],
                     None if kvm[0] else "VM workers fall back to TCG (software emulation, much slower)"))
    return out


def _gpu() -> list[Check]:
    out = []
    from testbed.nodes.gpus import gpu_names

    gpus = gpu_names()
    out.append(Check("GPUs", bool(gpus), f"{len(gpus)} GPU(s): " + "; ".join(gpus) if gpus else "none found",
                     None if gpus else "CPU runs use gloo; GPU runs need NVIDIA drivers (nvidia-smi)"))
    try:
        import torch  # type: ignore

        if torch.cuda.is_available():
            v = torch.cuda.nccl.version()
            vs = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
            out.append(Check("NCCL", True, f"torch {torch.__version__}, NCCL {vs}"))
        else:
            out.append(Check("NCCL", False, f"torch {torch.__version__} without CUDA",
                             "install a CUDA build of torch for NCCL runs; gloo works on CPU"))
    except ImportError:
        out.append(Check("NCCL", False, "torch not installed", "pip install torch (workloads need it)"))
    return out


def as_dicts(checks: list[Check]) -> list[dict]:
    return [asdict(c) for c in checks]
