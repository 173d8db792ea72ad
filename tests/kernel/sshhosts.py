"""Hosts for the multi-host tests: real SSH servers, each in its own network namespace on an
underlay bridge, with its own mount namespace (a private /run/netns and /run/testbed), so
that what testbed makes "on a host" is invisible from the controller, as on another
machine. Keys (host keys, the client key, known_hosts) are generated per session.

The controller is this machine's root namespace: the underlay bridge ``tbul0`` carries
198.18.0.1/24 (RFC 2544's benchmarking range), host i listens on 198.18.0.(10+i).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

BRIDGE = "tbul0"
NET = "198.18.0"
SSHD = "/usr/sbin/sshd"


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run(list(argv), capture_output=True, text=True)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {r.stderr.strip()}")
    return r


class InMounts:
    """A lab host's or node's view: commands in the mount and network namespaces of its
    daemon (``proc``: sshd, slurmd), where its /run/netns and state directory are private."""

    proc: subprocess.Popen | None

    def in_mounts(self, *argv: str) -> subprocess.CompletedProcess:
        """Run ``argv`` in this host's mount and network namespaces (what it sees)."""
        assert self.proc is not None
        return _run("nsenter", f"--mount=/proc/{self.proc.pid}/ns/mnt", f"--net=/proc/{self.proc.pid}/ns/net",
                    *argv, check=False)

    def namespaces(self) -> list[str]:
        return sorted(self.in_mounts("ip", "netns", "list").stdout.split())


@dataclass
class SSHHost(InMounts):
    name: str
    address: str
    netns: str
    dir: Path
    proc: subprocess.Popen | None = None

    def spec(self, key: Path, known_hosts: Path, **extra) -> dict:
        """Its ``hosts:`` entry."""
        return {"name": self.name, "address": self.address, "key": str(key), "known_hosts": str(known_hosts),
                "testbed": str(Path(sys.executable).parent / "testbed"), **extra}

    def ledgers(self) -> list[str]:
        """Its state directory's entries (testbeds' ledgers; files left in targets/)."""
        top = [p for p in self.in_mounts("ls", "-A", "/run/testbed").stdout.split() if p != ".lock"]
        out = [p for p in top if p not in ("targets", "monitors")]
        for d in ("targets", "monitors"):
            if d in top:
                out += [f"{d}/{f}" for f in self.in_mounts("ls", "-A", f"/run/testbed/{d}").stdout.split()]
        return sorted(out)

    def cut(self, off: bool = True) -> None:
        """Take its underlay port down (``off``) or up again: it stops answering, as a host
        whose cable was pulled or that froze does (no reset, no FIN: packets vanish)."""
        _run("ip", "link", "set", f"tbh{self.name[1:]}", "down" if off else "up")
        if not off:
            deadline = time.monotonic() + 20
            while not _probe(self.netns, self.address) and time.monotonic() < deadline:
                time.sleep(0.1)

    def wrapper(self, pause: str | None = None, seconds: float = 3, env: str = "", version: str | None = None) -> str:
        """Write (again) this host's ``testbed`` program: a wrapper around the real one that,
        for the ``_host`` operation ``pause``, touches ``paused-OP`` in its directory and
        sleeps ``seconds`` first (once); ``env`` (``K=V ...``) is set for that operation;
        ``version`` makes it claim another version. Returns its path (for ``hosts[].testbed``)."""
        real = Path(sys.executable).parent / "testbed"
        path = self.dir / "testbed"
        run = f'exec env {env} "{real}" "$@"'
        if version is not None:
            code = (f"import sys, testbed.common.version as v; v.__version__ = {version!r}; "
                    "from testbed.cli import main; main(sys.argv[1:])")
            run = f'exec env {env} "{sys.executable}" -c "{code}" "$@"'
        body = (f'#!/bin/sh\nd="{self.dir}"\n'
                f'if [ "$3" = "{pause}" ] && [ ! -e "$d/paused-$3" ]; then touch "$d/paused-$3"; sleep {seconds}; fi\n'
                if pause else "#!/bin/sh\n") + run + "\n"
        path.write_text(body)
        path.chmod(0o755)
        for old in self.dir.glob("paused-*"):
            old.unlink()
        return str(path)

    def new_host_key(self) -> None:
        """Replace its host key (as a reinstall would) and restart its sshd."""
        key = self.dir / "ssh_host_ed25519_key"
        key.unlink()
        key.with_suffix(".pub").unlink()
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key))
        self.stop()
        self.start()

    def start(self) -> None:
        cfg = self.dir / "sshd_config"
        inner = ("mkdir -p /run/netns /run/testbed /run/sshd && mount -t tmpfs -o mode=755 tbnetns /run/netns && "
                 "mount -t tmpfs -o mode=700 tbstate /run/testbed && exec " + SSHD + f" -D -e -f {cfg}")
        log = open(self.dir / "sshd.log", "ab")
        self.proc = subprocess.Popen(["ip", "netns", "exec", self.netns, "unshare", "--mount", "--propagation",
                                      "private", "sh", "-c", inner], stdout=log, stderr=log,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if _probe(self.netns, self.address):
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        raise RuntimeError(f"sshd of {self.name} did not start: {(self.dir / 'sshd.log').read_text()[-800:]}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.proc = None


def _probe(ns: str, address: str) -> bool:
    r = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c",
                        f"import socket; socket.create_connection(('{address}', 22), 1).close()"],
                       capture_output=True)
    return r.returncode == 0


@dataclass
class Lab:
    dir: Path
    hosts: list[SSHHost]
    key: Path
    known_hosts: Path

    def host_specs(self, **extra) -> list[dict]:
        return [h.spec(self.key, self.known_hosts, **extra) for h in self.hosts]

    def leftovers(self) -> dict[str, list[str]]:
        """What each host still has of any testbed: namespaces, ledgers."""
        return {h.name: h.namespaces() + h.ledgers() for h in self.hosts if h.namespaces() or h.ledgers()}

    def write_known_hosts(self) -> None:
        lines = []
        for h in self.hosts:
            pub = (h.dir / "ssh_host_ed25519_key.pub").read_text().split()
            lines.append(f"{h.address} {pub[0]} {pub[1]}\n")
        self.known_hosts.write_text("".join(lines))


def build(root: Path, n: int) -> Lab:
    """``n`` SSH hosts on a fresh underlay bridge; :func:`destroy` removes them."""
    if not Path(SSHD).exists():
        raise FileNotFoundError(SSHD)
    destroy_stale()
    _run("ip", "link", "add", BRIDGE, "type", "bridge")
    _run("ip", "addr", "add", f"{NET}.1/24", "dev", BRIDGE)
    _run("ip", "link", "set", BRIDGE, "up")
    key = root / "id_ed25519"
    _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key))
    # readable by any user (a test logs in as one that is not root; pytest's tmp is 0700)
    keys = Path(f"/run/tblab-{os.getpid()}")
    keys.mkdir(mode=0o755, exist_ok=True)
    auth = keys / "authorized_keys"
    shutil.copy(key.with_suffix(".pub"), auth)
    auth.chmod(0o644)
    hosts = []
    for i in range(1, n + 1):
        name, addr, ns = f"h{i}", f"{NET}.{10 + i}", f"tbhost{i}"
        d = root / name
        d.mkdir()
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / "ssh_host_ed25519_key"))
        (d / "sshd_config").write_text(
            f"ListenAddress {addr}\nPort 22\nHostKey {d / 'ssh_host_ed25519_key'}\nPidFile {d / 'sshd.pid'}\n"
            f"AuthorizedKeysFile {auth}\nPermitRootLogin prohibit-password\nPasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\nLogLevel ERROR\n"
            "Subsystem sftp internal-sftp\n")
        _run("ip", "netns", "add", ns)
        _run("ip", "link", "add", f"tbh{i}", "type", "veth", "peer", "name", "eth0", "netns", ns)
        _run("ip", "link", "set", f"tbh{i}", "master", BRIDGE, "up")
        _run("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0")
        _run("ip", "-n", ns, "link", "set", "eth0", "up")
        _run("ip", "-n", ns, "link", "set", "lo", "up")
        h = SSHHost(name, addr, ns, d)
        h.start()
        hosts.append(h)
    lab = Lab(root, hosts, key, root / "known_hosts")
    lab.write_known_hosts()
    return lab


def destroy(lab: Lab) -> None:
    for h in lab.hosts:
        h.stop()
    destroy_stale()
    shutil.rmtree(f"/run/tblab-{os.getpid()}", ignore_errors=True)


def _lab_links() -> list[str]:
    out = _run("ip", "-o", "link", "show", check=False).stdout
    names = [l.split(":")[1].strip().split("@")[0] for l in out.splitlines() if ":" in l]
    return [n for n in names if n == BRIDGE or (n.startswith("tbh") and n[3:].isdigit())]


def destroy_stale() -> None:
    """Remove a lab (also one a killed session left). The host-side veth ends are deleted
    first: a namespace's own devices go only when the kernel gets round to freeing it
    (asynchronously), and the next test's snapshot must not see them."""
    for link in _lab_links():
        if link != BRIDGE:
            _run("ip", "link", "del", link, check=False)
    for ns in _run("ip", "netns", "list", check=False).stdout.split():
        if ns.startswith("tbhost"):
            pids = _run("ip", "netns", "pids", ns, check=False).stdout.split()
            for p in pids:
                try:
                    os.kill(int(p), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            _run("ip", "netns", "del", ns, check=False)
    _run("ip", "link", "del", BRIDGE, check=False)
    deadline = time.monotonic() + 10
    while _lab_links() and time.monotonic() < deadline:
        time.sleep(0.1)
