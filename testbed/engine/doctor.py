"""`testbed doctor`: what this machine can do, each missing piece with a hint, and which
machine that is (:func:`where`)."""

from __future__ import annotations

import os
import shutil
from dataclasses import asdict

from testbed.common import rootless, slurmenv
from testbed.common.errors import TestbedError
from testbed.net.probe import probe
from testbed.nodes import BACKENDS
from testbed.nodes.base import Check
from testbed.nodes.gpus import gpu_names


def _cap_net_admin() -> bool:
    try:
        for line in open("/proc/self/status"):
            if line.startswith("CapEff:"):
                return bool(int(line.split()[1], 16) & (1 << 12))
    except OSError:
        pass
    return False


def _privileges() -> list[Check]:
    """Root, or an ordinary user's rootless namespaces (and whether those can be made here)."""
    blockers = rootless.userns_blockers()
    userns = Check("unprivileged user namespaces", not blockers,
                   "; ".join(b[0] for b in blockers) if blockers else "ordinary users can make them (rootless mode)",
                   "; ".join(b[1] for b in blockers) or None)
    if rootless.active():
        return [Check("privileges", True, f"rootless: uid {rootless.outer_uid()} mapped to root in its own user "
                      f"namespace (state in {rootless.private_root()}, seen only inside)", required=True), userns]
    if os.geteuid() == 0:
        return [Check("privileges", True, "running as root", required=True), userns]
    failure = rootless.enter_failure
    why = failure.message if failure is not None else "not probed"
    return [Check("privileges", False, f"not root, and rootless mode is unavailable: {why}",
                  (failure.hint if failure is not None else None) or "run testbed with sudo", required=True), userns]


def run_checks() -> list[Check]:
    checks: list[Check] = _privileges()
    root = os.geteuid() == 0
    cap = _cap_net_admin()
    module_fix = ("an administrator loads it once: sudo modprobe sch_{}" + (" (a user namespace cannot load kernel "
                  "modules)" if rootless.active() else ""))
    kernel_hints = {
        "netns": ("kernel built without network namespaces (CONFIG_NET_NS)", True),
        "veth": ("load the veth module: modprobe veth", True),
        "bridge": ("load the bridge module: modprobe bridge", True),
        "htb": (module_fix.format("htb"), True),
        "tbf": (module_fix.format("tbf") + " (not needed by testbed itself)", False),
        "netem": ("delay, jitter and loss need sch_netem: modprobe sch_netem (package linux-modules-extra-$(uname -r) "
                  "on Ubuntu); bandwidth shaping works without it", False),
    }
    if root or cap:
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
        for k, (_hint, required) in kernel_hints.items():
            checks.append(Check(k, False, "not probed (needs root or rootless mode)", "run `sudo $(command -v testbed) doctor`",
                            required))

    for backend in BACKENDS.values():  # each backend says what it needs (engine, images, tools)
        checks.extend(backend.checks())
    prom = shutil.which("prometheus")
    checks.append(Check("prometheus binary", bool(prom), prom or "not found",
                        None if prom else "apt-get install prometheus (needed by `testbed monitor`)"))
    iperf = shutil.which("iperf3")
    checks.append(Check("iperf3", bool(iperf), iperf or "not found",
                        None if iperf else "apt-get install iperf3 (fidelity tests and benchmarks)"))
    checks.extend(_gpu())
    return checks


def _gpu() -> list[Check]:
    out = []
    gpus = gpu_names()
    out.append(Check("GPUs", bool(gpus), f"{len(gpus)} GPU(s): " + "; ".join(gpus) if gpus else "none found",
                     None if gpus else "CPU runs use gloo; GPU runs need NVIDIA drivers (nvidia-smi)"))
    try:
        import torch

        if torch.cuda.is_available():
            v = torch.cuda.nccl.version()
            vs = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
            out.append(Check("NCCL", True, f"torch {torch.__version__}, NCCL {vs}"))
        elif torch.version.cuda is None:
            out.append(Check("NCCL", False, f"torch {torch.__version__} is a CPU-only build",
                             "install a CUDA build of torch for NCCL runs; gloo works on CPU"))
        else:
            out.append(Check("NCCL", False, f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no GPU",
                             "NCCL runs need an NVIDIA GPU and its driver (nvidia-smi); gloo works on CPU"))
    except ImportError:
        out.append(Check("NCCL", False, "torch not installed", "pip install torch (workloads need it)"))
    return out


def where() -> dict:
    """The machine the checks ran on: its hostname, and its Slurm node name and job where it
    is a node of a job (``srun -N 2 testbed doctor``: one report per node, each saying which).
    A Slurm variable that is not what Slurm sets is a one-line StateError naming it
    (:mod:`testbed.common.slurmenv`)."""
    return {"host": os.uname().nodename, "slurm_node": slurmenv.node_name(), "slurm_job": slurmenv.job_id()}


def describe(place: dict) -> str:
    """``host gpu08`` or ``host gpu08 (Slurm node gpu08 of job 42)``."""
    text = f"host {place['host']}"
    if place.get("slurm_node"):
        text += f" (Slurm node {place['slurm_node']}" + (f" of job {place['slurm_job']}" if place.get("slurm_job")
                                                            else "") + ")"
    return text


def as_dicts(checks: list[Check]) -> list[dict]:
    return [asdict(c) for c in checks]
