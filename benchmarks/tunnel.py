"""TCP goodput / rate across the rootless user-space tunnel, and its CPU cost per Gbit/s.

Two "hosts" on this one machine, each a user + network namespace of an ordinary user
(``unshare -Urn``, no root anywhere): in each, a veth pair ``tl`` (the link's end, with an
address, shaped with HTB as testbed shapes local links: :mod:`testbed.net.tc`) and ``tf``
(the tunnel's end), and a forwarder (:mod:`testbed.net.tunnel`) with its UDP socket on the
machine's loopback. For each rate, iperf3 sends one TCP stream from host a to host b for
``--seconds`` (after a 1 s warm-up, ``-O 1``); printed: goodput / rate (the issue's target is
0.93; HTB counts Ethernet frames, so TCP at MTU 1500 tops out near 0.956), and the CPU both
forwarders used (utime + stime from /proc/PID/stat) per Gbit/s of goodput. ``unshaped``
measures the tunnel's own ceiling.

    python -m benchmarks.tunnel [--rates 100mbit,500mbit,1gbit,unshaped] [--seconds 10] [--max-payload N]
                                [--no-baseline] [--json]

Before each rate, the same rate on a plain local veth link (what testbed makes for a link on
one host) is measured too, so that a busy machine's own shortfall shows beside the tunnel's.

Run it as an ordinary user (``runuser -u USER -- .venv/bin/python -m benchmarks.tunnel``);
needs iperf3, iproute2 and util-linux (unshare, nsenter). The kernel test
(tests/kernel/test_tunnel.py) builds the same lab with :class:`Lab`.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from testbed.model.units import Rate  # noqa: E402
from testbed.net import tunnelwire  # noqa: E402

RATES = "100mbit,500mbit,1gbit,unshaped"
TARGET = 0.93
SUBNET = "10.77.0."
LOCAL_SUBNET = "10.78.0."
GSO_MAX = 60000
"""The link ends' gso_max_size: a GSO frame, its vnet header and ours fit one UDP datagram."""
CLK_TCK = os.sysconf("SC_CLK_TCK")


def _run(argv: list[str], timeout: float = 30) -> str:
    r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {r.stderr.strip()[:500]}")
    return r.stdout


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads), in seconds."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read(4096).rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


@dataclass
class Host:
    """One pretend host: a user + network namespace held by a sleeping process."""

    name: str
    addr: str
    holder: subprocess.Popen
    forwarder: subprocess.Popen | None = None
    port: int = 0
    counters: dict = field(default_factory=dict)
    log: str = ""
    """The forwarder's stderr once it stopped (its warnings, its counters)."""

    def ns(self, kind: str) -> str:
        return f"/proc/{self.holder.pid}/ns/{kind}"

    def enter(self, *argv: str) -> list[str]:
        """``argv`` run inside this host's namespaces (as root there, our uid outside)."""
        return ["nsenter", "-t", str(self.holder.pid), "-U", "-n", "--preserve-credentials", *argv]

    def run(self, *argv: str) -> str:
        return _run(self.enter(*argv))


def _holder(name: str, index: int) -> Host:
    proc = subprocess.Popen(["unshare", "-Urn", "sleep", "infinity"], stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    mine = os.stat("/proc/self/ns/net").st_ino
    while time.monotonic() < deadline:
        try:
            if os.stat(f"/proc/{proc.pid}/ns/net").st_ino != mine:
                return Host(name, f"{SUBNET}{index}", proc)
        except OSError:
            pass
        if proc.poll() is not None:
            raise RuntimeError(f"unshare -Urn failed (exit {proc.returncode}): no unprivileged user namespaces?")
        time.sleep(0.01)
    proc.kill()
    raise RuntimeError("unshare -Urn did not start in time")


class Lab:
    """Two pretend hosts joined by the tunnel; a context manager that leaves nothing."""

    def __init__(self, token: bytes | None = None, gso_max_size: int = GSO_MAX, baseline: bool = False,
                 max_payload: int | None = None) -> None:
        self.token = token or tunnelwire.new_token()
        self.max_payload = max_payload
        self.gso = gso_max_size
        self.hosts: list[Host] = []
        self.baseline = baseline
        self.local: Host | None = None
        """With ``baseline``: a namespace inside host a joined to it by a plain veth pair
        (a local link as testbed makes it: veth ``vl`` -- ``vr``), for comparison."""

    def __enter__(self) -> Lab:
        try:
            self.hosts = [_holder("a", 1)]
            self.hosts.append(_holder("b", 2))
            for h in self.hosts:
                self._links(h)
            self._forwarders()
            if self.baseline:
                self._local_link()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def a(self) -> Host:
        return self.hosts[0]

    @property
    def b(self) -> Host:
        return self.hosts[1]

    def _links(self, h: Host) -> None:
        h.run("ip", "link", "add", "tl", "gso_max_size", str(self.gso), "type", "veth",
              "peer", "name", "tf", "gso_max_size", str(self.gso))
        for dev in ("tl", "tf"):  # no IPv6 link-local chatter across the link
            h.run("ip", "link", "set", dev, "addrgenmode", "none")
        h.run("ip", "addr", "add", f"{h.addr}/24", "dev", "tl")
        for dev in ("lo", "tf", "tl"):
            h.run("ip", "link", "set", dev, "up")

    def _local_link(self) -> None:
        proc = subprocess.Popen(self.a.enter("unshare", "-n", "sleep", "infinity"), stdin=subprocess.DEVNULL)
        self.local = Host("local", f"{LOCAL_SUBNET}2", proc)
        deadline = time.monotonic() + 10
        # until unshare made its own: the process starts in ours, then nsenter takes it to a's
        before = {os.stat("/proc/self/ns/net").st_ino, os.stat(self.a.ns("net")).st_ino}
        while os.stat(f"/proc/{proc.pid}/ns/net").st_ino in before:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("could not make the baseline's namespace")
            time.sleep(0.01)
        self.a.run("ip", "link", "add", "vl", "type", "veth", "peer", "name", "vr", "netns", str(proc.pid))
        self.a.run("ip", "addr", "add", f"{LOCAL_SUBNET}1/24", "dev", "vl")
        self.a.run("ip", "link", "set", "vl", "up")
        self.local.run("ip", "addr", "add", f"{self.local.addr}/24", "dev", "vr")
        for dev in ("lo", "vr"):
            self.local.run("ip", "link", "set", dev, "up")

    def _forwarder_argv(self, h: Host) -> list[str]:
        """Host a's forwarder joins the user namespace itself (``--userns``); host b's is started
        inside it, in the host's network namespace, as testbed's rootless commands run
        (:mod:`testbed.common.rootless`), and only switches network namespace."""
        argv = [sys.executable, "-m", "testbed.net.tunnel", "--ifname", "tf", "--bind", "127.0.0.1:0",
                "--netns", h.ns("net"), *(["--max-payload", str(self.max_payload)] if self.max_payload else [])]
        if h is self.a:
            return [*argv, "--userns", h.ns("user")]
        return ["nsenter", "-t", str(h.holder.pid), "-U", "--preserve-credentials", *argv]  # nsenter execs: same pid

    def _forwarders(self) -> None:
        for h in self.hosts:
            h.forwarder = subprocess.Popen(self._forwarder_argv(h), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                           stderr=subprocess.PIPE, text=True)
            assert h.forwarder.stdin and h.forwarder.stdout
            h.forwarder.stdin.write(self.token.hex() + "\n")
            h.forwarder.stdin.flush()
            h.port = int(self._expect(h, "bound").split()[2])
        for h, peer in ((self.a, self.b), (self.b, self.a)):
            assert h.forwarder and h.forwarder.stdin
            h.forwarder.stdin.write(f"peer 127.0.0.1 {peer.port}\n")
            h.forwarder.stdin.flush()
        for h in self.hosts:
            self._expect(h, "ready")

    @staticmethod
    def _expect(h: Host, word: str) -> str:
        assert h.forwarder and h.forwarder.stdout
        line = h.forwarder.stdout.readline(512)
        if not line.startswith(word):
            err = h.forwarder.stderr.read(2000) if h.forwarder.poll() is not None and h.forwarder.stderr else ""
            raise RuntimeError(f"forwarder on {h.name}: expected {word!r}, got {line!r} {err}")
        return line

    def shape(self, rate: Rate | None) -> None:
        """HTB on every link end's egress, as testbed.net.tc does (None: no shaping)."""
        ends = [(h, "tl") for h in self.hosts]
        if self.local:
            ends += [(self.a, "vl"), (self.local, "vr")]
        for h, dev in ends:
            subprocess.run(h.enter("tc", "qdisc", "del", "dev", dev, "root"), capture_output=True)
            if rate is None:
                continue
            burst = str(max(15000, rate.bytes_per_second // 1000))
            h.run("tc", "qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default", "1")
            h.run("tc", "class", "add", "dev", dev, "parent", "1:", "classid", "1:1", "htb", "rate",
                  f"{rate.bps}bit", "ceil", f"{rate.bps}bit", "burst", burst, "cburst", burst, "quantum", "60000")

    def forwarder_cpu(self) -> float:
        return sum(cpu_seconds(h.forwarder.pid) for h in self.hosts if h.forwarder)

    def stop_forwarders(self) -> None:
        """SIGTERM both forwarders; their counters (JSON on stderr) land in ``counters``, the
        whole of their stderr in ``log``."""
        for h in self.hosts:
            if h.forwarder and h.forwarder.poll() is None:
                h.forwarder.send_signal(signal.SIGTERM)
        for h in self.hosts:
            if h.forwarder:
                try:
                    _, err = h.forwarder.communicate(timeout=10)
                except subprocess.TimeoutExpired:
                    h.forwarder.kill()
                    _, err = h.forwarder.communicate()
                h.log = err or ""
                lines = [ln for ln in h.log.splitlines() if ln.startswith("{")]
                h.counters = json.loads(lines[-1]) if lines else {}

    def close(self) -> None:
        self.stop_forwarders()
        for h in ([self.local] if self.local else []) + self.hosts:
            h.holder.kill()
            h.holder.wait()


def udp_drops() -> int:
    """This network namespace's UDP datagrams dropped for a full receive buffer (all sockets)."""
    with open("/proc/net/snmp", "rb") as f:
        rows = [ln.split() for ln in f.read(65536).splitlines() if ln.startswith(b"Udp:")]
    return int(rows[1][rows[0].index(b"RcvbufErrors")])


def iperf(client: Host, server_host: Host, seconds: float) -> tuple[float, int]:
    """One TCP stream for ``seconds`` after a 1 s warm-up: goodput in bit/s, retransmits."""
    server = subprocess.Popen(server_host.enter("iperf3", "-s", "-1", "-B", server_host.addr),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(50):  # the server listens
            if f"{server_host.addr}:5201" in server_host.run("ss", "-Htln"):
                break
            time.sleep(0.05)
        out = _run(client.enter("iperf3", "-c", server_host.addr, "-t", str(seconds), "-O", "1", "-J"),
                   timeout=seconds + 30)
    finally:
        try:
            server.wait(timeout=5)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    end = json.loads(out)["end"]
    return end["sum_received"]["bits_per_second"], end["sum_sent"].get("retransmits", 0)


def measure(lab: Lab, rate: Rate | None, seconds: float) -> dict:
    lab.shape(rate)
    base = None
    if lab.local:  # the same rate on a plain local veth link, just before: what this machine gives now
        base, _ = iperf(lab.a, lab.local, seconds)
    cpu0, t0, drops0 = lab.forwarder_cpu(), time.monotonic(), udp_drops()
    bps, retransmits = iperf(lab.a, lab.b, seconds)
    cpu, wall = lab.forwarder_cpu() - cpu0, time.monotonic() - t0
    # CPU over the whole iperf3 run (warm-up included) against goodput over the same span
    gbit = bps * (seconds + 1) / 1e9
    return {"rate": str(rate) if rate else "unshaped", "goodput_mbit": round(bps / 1e6, 1),
            "ratio": round(bps / rate.bps, 3) if rate else None,
            "cpu_s_per_gbit": round(cpu / gbit, 3) if gbit else None,
            "cpu_percent": round(100 * cpu / wall, 1), "retransmits": retransmits,
            "udp_rcvbuf_drops": udp_drops() - drops0,
            "veth_goodput_mbit": round(base / 1e6, 1) if base is not None else None}


def _line(r: dict) -> str:
    ratio = f"{r['ratio']:.3f}" if r["ratio"] is not None else "  -  "
    veth = f"  (plain veth now: {r['veth_goodput_mbit']:.1f})" if r["veth_goodput_mbit"] is not None else ""
    return (f"{r['rate']:>9}  tunnel {r['goodput_mbit']:7.1f} Mbit/s  ratio {ratio}{veth}  "
            f"forwarders {r['cpu_s_per_gbit']:.3f} CPU-s/Gbit ({r['cpu_percent']:.0f}% of a core)  "
            f"retransmits {r['retransmits']}  UDP drops {r['udp_rcvbuf_drops']}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rates", default=RATES, help="comma-separated rates; 'unshaped' for the tunnel's ceiling")
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--no-baseline", action="store_true",
                    help="skip the plain veth link measured before each rate (shows what a busy machine gives)")
    ap.add_argument("--max-payload", type=int, help="the forwarders' largest UDP payload (e.g. 1472: no IP "
                    "fragments on a 1500-byte underlay; frames are then sent in parts)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rates = [None if r == "unshaped" else Rate.parse(r) for r in args.rates.split(",")]
    rows = []
    with Lab(baseline=not args.no_baseline, max_payload=args.max_payload) as lab:
        for rate in rates:
            rows.append(measure(lab, rate, args.seconds))
            if not args.json:
                print(_line(rows[-1]), flush=True)
        lab.stop_forwarders()
        counters = {h.name: h.counters for h in lab.hosts}
    if args.json:
        print(json.dumps({"rows": rows, "counters": counters, "target": TARGET}))
    else:
        print(f"forwarder counters: {json.dumps(counters)}")


if __name__ == "__main__":
    main()
