"""A real Slurm cluster on this machine for the Slurm tests: munged and slurmctld in the
root namespace, one ``slurmd -N NAME`` per "node", each in its own network, UTS and mount
namespace (a private /run/netns and /run/testbed, as :mod:`tests.kernel.sshhosts` makes
sshd hosts), on an underlay bridge of its own. What testbed makes on a node is then
invisible from the controller and from the other node, as on separate machines.

By hand (as root), to try the Slurm path before a cluster::

    python -m tests.kernel.slurm_lab up /tmp/tblab 2   # prints the SLURM_CONF to export
    SLURM_CONF=/tmp/tblab/slurm.conf salloc -N 2 ...
    python -m tests.kernel.slurm_lab down /tmp/tblab

The controller (salloc, srun, testbed up) is the root namespace: the bridge ``tbsl0``
carries 198.19.0.1/24, node i (``sn{i}``) is 198.19.0.(10+i).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.kernel.sshhosts import InMounts

BRIDGE = "tbsl0"
NET = "198.19.0"
CTLD_PORT = 17817
FORWARD_RULE = ("-i", BRIDGE, "-o", BRIDGE, "-j", "ACCEPT")


def _run(*argv: str, check: bool = True, env: dict | None = None) -> subprocess.CompletedProcess:
    r = subprocess.run(list(argv), capture_output=True, text=True, env=env)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {r.stderr.strip() or r.stdout.strip()}")
    return r


@dataclass
class SlurmNode(InMounts):
    name: str
    address: str
    netns: str
    proc: subprocess.Popen | None = None

    def ledgers(self) -> list[str]:
        return sorted(p for p in self.in_mounts("ls", "-A", "/run/testbed").stdout.split()
                      if p not in (".lock", "targets", "monitors"))


@dataclass
class SlurmLab:
    dir: Path
    nodes: list[SlurmNode]
    procs: list[subprocess.Popen] = field(default_factory=list)

    @property
    def conf(self) -> Path:
        return self.dir / "slurm.conf"

    def env(self, **extra: str) -> dict[str, str]:
        """This process's environment with the lab's SLURM_CONF (no job of an outer Slurm)."""
        e = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        return {**e, "SLURM_CONF": str(self.conf), **extra}

    def leftovers(self) -> dict[str, list[str]]:
        """What each node still has of any testbed: namespaces, ledgers."""
        return {n.name: n.namespaces() + n.ledgers() for n in self.nodes if n.namespaces() or n.ledgers()}

    def jobs(self) -> list[str]:
        return _run("squeue", "-h", "-o", "%i %T", check=False, env=self.env()).stdout.split("\n")[:-1]


def _conf(d: Path, nodes: list[SlurmNode]) -> str:
    lines = [
        "ClusterName=tblab", f"SlurmctldHost={socket.gethostname().split('.')[0]}({NET}.1)", f"SlurmctldPort={CTLD_PORT}",
        "AuthType=auth/munge", "CredType=cred/munge", f"AuthInfo=socket={d}/munge.sock",
        "SlurmUser=root", "SlurmdUser=root", f"StateSaveLocation={d}/ctld",
        f"SlurmdSpoolDir={d}/spool-%n", f"SlurmctldPidFile={d}/slurmctld.pid", f"SlurmdPidFile={d}/slurmd-%n.pid",
        f"SlurmctldLogFile={d}/slurmctld.log", f"SlurmdLogFile={d}/slurmd-%n.log",
        "ProctrackType=proctrack/cgroup", "TaskPlugin=task/none", "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU", "ReturnToService=2", "MailProg=/bin/true", "MpiDefault=none",
        "JobCompType=jobcomp/none", "AccountingStorageType=accounting_storage/none", "KillWait=5",
        "SlurmctldTimeout=30", "SlurmdTimeout=20", "InactiveLimit=0", "MinJobAge=2",
        "SlurmctldDebug=info", "SlurmdDebug=info",
    ]
    for i, n in enumerate(nodes, 1):
        lines.append(f"NodeName={n.name} NodeAddr={n.address} NodeHostname={n.name} Port={17000 + i} CPUs={os.cpu_count()} "
                     "State=UNKNOWN")
    lines.append(f"PartitionName=lab Nodes={','.join(n.name for n in nodes)} Default=YES MaxTime=INFINITE "
                 "State=UP OverSubscribe=FORCE:4")
    return "\n".join(lines) + "\n"


def _start(argv: list[str], log: Path) -> subprocess.Popen:
    f = open(log, "ab")
    return subprocess.Popen(argv, stdout=f, stderr=f, stdin=subprocess.DEVNULL, start_new_session=True)


def build(root: Path, n: int = 2) -> SlurmLab:
    """``n`` Slurm nodes on a fresh underlay bridge, all idle; :func:`destroy` removes them."""
    destroy_stale()
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o755)  # munged refuses a socket directory others may write to
    _run("ip", "link", "add", BRIDGE, "type", "bridge")
    _run("ip", "addr", "add", f"{NET}.1/24", "dev", BRIDGE)
    _run("ip", "link", "set", BRIDGE, "up")
    # bridged frames between nodes (the VXLAN tunnels) pass iptables' FORWARD chain when
    # br_netfilter is loaded, whose policy Docker sets to DROP: let the lab's own through
    _run("iptables", "-I", "FORWARD", *FORWARD_RULE, check=False)
    nodes = [SlurmNode(f"sn{i}", f"{NET}.{10 + i}", f"tbslurm{i}") for i in range(1, n + 1)]
    for i, node in enumerate(nodes, 1):
        _run("ip", "netns", "add", node.netns)
        _run("ip", "link", "add", f"tbs{i}", "type", "veth", "peer", "name", "eth0", "netns", node.netns)
        _run("ip", "link", "set", f"tbs{i}", "master", BRIDGE, "up")
        _run("ip", "-n", node.netns, "addr", "add", f"{node.address}/24", "dev", "eth0")
        _run("ip", "-n", node.netns, "link", "set", "eth0", "up")
        _run("ip", "-n", node.netns, "link", "set", "lo", "up")
    lab = SlurmLab(root, nodes)
    (root / "ctld").mkdir(exist_ok=True)
    lab.conf.write_text(_conf(root, nodes))
    (root / "cgroup.conf").write_text("CgroupPlugin=autodetect\nConstrainCores=no\nConstrainRAMSpace=no\n"
                                      "ConstrainDevices=no\n")
    key = root / "munge.key"
    if not key.exists():
        _run("mungekey", "--create", f"--keyfile={key}")
    key.chmod(0o600)
    lab.procs.append(_start(["munged", "--foreground", "--force", f"--key-file={key}", f"--socket={root}/munge.sock",
                             f"--pid-file={root}/munged.pid", f"--seed-file={root}/munge.seed",
                             f"--log-file={root}/munged.log"], root / "munged.out"))
    _wait(lambda: (root / "munge.sock").exists(), "munged", root / "munged.out")
    lab.procs.append(_start(["slurmctld", "-D", "-f", str(lab.conf)], root / "slurmctld.out"))
    for node in nodes:
        boot(lab, node)
    _wait(lambda: _idle(lab), "the nodes to be idle", root / "slurmctld.log",
          procs=lab.procs + [n.proc for n in nodes if n.proc is not None])
    return lab


def boot(lab: SlurmLab, node: SlurmNode) -> None:
    """Start ``node``'s slurmd in a fresh mount (and UTS) namespace, with an empty /run/netns
    and state directory of its own: a node as a boot leaves it."""
    inner = ("mkdir -p /run/netns /run/testbed && mount -t tmpfs -o mode=755 tbnetns /run/netns && "
             f"mount -t tmpfs -o mode=700 tbstate /run/testbed && hostname {node.name} && "
             f"exec slurmd -D -N {node.name} -f {lab.conf}")
    (lab.dir / f"spool-{node.name}").mkdir(exist_ok=True)
    # nsenter, not `ip netns exec`: that remounts /sys, hiding the cgroup hierarchies slurmd tracks steps in
    node.proc = _start(["nsenter", f"--net=/run/netns/{node.netns}", "unshare", "--mount", "--uts", "--propagation",
                        "private", "sh", "-c", inner], lab.dir / f"slurmd-{node.name}.out")


def crash(node: SlurmNode) -> int:
    """``node`` dies as a machine does: SIGKILL to every process in its mount namespace
    (slurmd, its steps and all they started, whatever network namespace they run in), none
    of which can act; with the last of them the namespace goes, and with it the node's
    /run/netns mounts and state directory, so its namespaces are freed as a reboot frees
    them. Returns how many processes were killed."""
    assert node.proc is not None
    mnt = os.readlink(f"/proc/{node.proc.pid}/ns/mnt")
    killed = 0
    for _ in range(20):  # a process may fork while we look: until none is left
        pids = [int(e.name) for e in os.scandir("/proc") if e.name.isdigit() and _mnt_of(int(e.name)) == mnt]
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
        time.sleep(0.1)
    node.proc.wait(10)
    return killed


def _mnt_of(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/mnt")
    except OSError:
        return None


def _idle(lab: SlurmLab) -> bool:
    r = _run("sinfo", "-h", "-N", "-o", "%N %t", check=False, env=lab.env())
    states = dict(line.split() for line in r.stdout.splitlines() if len(line.split()) == 2)
    return len(states) == len(lab.nodes) and all(s == "idle" for s in states.values())


def _wait(ready, what: str, log: Path, timeout: float = 60, procs=()) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ready():
            return
        if any(p.poll() is not None for p in procs):
            break
        time.sleep(0.2)
    tail = log.read_text(errors="replace")[-1500:] if log.exists() else ""
    raise RuntimeError(f"waiting for {what} timed out: {tail}")


def destroy(lab: SlurmLab) -> None:
    """Cancel every job, stop the daemons (slurmds first), remove the namespaces and the bridge."""
    _run("scancel", "--full", "-u", "root", check=False, env=lab.env())
    for p in [n.proc for n in lab.nodes if n.proc is not None] + list(reversed(lab.procs)):
        _stop(p)
    destroy_stale()


def _stop(p: subprocess.Popen) -> None:
    if p.poll() is None:
        try:
            os.killpg(p.pid, signal.SIGTERM)
            p.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        except ProcessLookupError:
            pass


def _lab_links() -> list[str]:
    out = _run("ip", "-o", "link", "show", check=False).stdout
    names = [l.split(":")[1].strip().split("@")[0] for l in out.splitlines() if ":" in l]
    return [n for n in names if n == BRIDGE or (n.startswith("tbs") and n[3:].isdigit())]


def destroy_stale() -> None:
    """Remove a lab's namespaces and links (also one a killed session left)."""
    for link in _lab_links():
        if link != BRIDGE:
            _run("ip", "link", "del", link, check=False)
    for ns in _run("ip", "netns", "list", check=False).stdout.split():
        if ns.startswith("tbslurm"):
            for p in _run("ip", "netns", "pids", ns, check=False).stdout.split():
                try:
                    os.kill(int(p), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            _run("ip", "netns", "del", ns, check=False)
    _run("ip", "link", "del", BRIDGE, check=False)
    while _run("iptables", "-D", "FORWARD", *FORWARD_RULE, check=False).returncode == 0:
        pass


def _pids(root: Path) -> list[int]:
    out = []
    for f in list(root.glob("*.pid")):
        try:
            out.append(int(f.read_text().split()[0]))
        except (OSError, ValueError, IndexError):
            pass
    return out


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] not in ("up", "down"):
        print("usage: python -m tests.kernel.slurm_lab up DIR [N] | down DIR", file=sys.stderr)
        return 2
    root = Path(argv[1]).resolve()
    if argv[0] == "up":
        t = time.monotonic()
        lab = build(root, int(argv[2]) if len(argv) > 2 else 2)
        print(f"{len(lab.nodes)} nodes idle in {time.monotonic() - t:.1f} s; export SLURM_CONF={lab.conf}")
        return 0
    _run("scancel", "--full", "-u", "root", check=False, env={**os.environ, "SLURM_CONF": str(root / "slurm.conf")})
    for pid in _pids(root):  # slurmds, slurmctld, munged: each started its own session
        try:
            os.killpg(os.getpgid(pid), signal.SIGTERM)
        except ProcessLookupError:
            pass
    destroy_stale()
    print("lab down")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
