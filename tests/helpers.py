"""Topology builders shared by tests and benchmarks."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import shutil
import sys
import time
from pathlib import Path


def star(n: int, name: str = "star", rate: str = "1gbit", prefix: str = "w") -> dict:
    nodes = {"s0": {"kind": "switch"}}
    nodes.update({f"{prefix}{i}": {"kind": "worker"} for i in range(n)})
    return {"name": name, "defaults": {"link": {"rate": rate}}, "nodes": nodes,
            "links": [{"endpoints": [f"{prefix}{i}", "s0"]} for i in range(n)]}


def dumbbell(name: str = "db", rate: str = "100mbit", **shape) -> dict:
    return {"name": name, "nodes": {"s0": {"kind": "switch"}, "s1": {"kind": "switch"},
                                    "w0": {"kind": "worker"}, "w1": {"kind": "worker"}},
            "links": [{"endpoints": ["w0", "s0"]}, {"endpoints": ["w1", "s1"]},
                      {"endpoints": ["s0", "s1"], "rate": rate, "bottleneck": True, **shape}]}


def star_of_stars(n: int, name: str = "stars", rate: str = "1gbit", per_leaf: int = 512) -> dict:
    """n workers on leaf switches of at most per_leaf ports, leaves joined by a core switch
    (a Linux bridge holds at most 1023 ports, so a flat star stops at 1023 workers)."""
    leaves = (n + per_leaf - 1) // per_leaf
    nodes = {"core": {"kind": "switch"}}
    nodes.update({f"leaf{j}": {"kind": "switch"} for j in range(leaves)})
    nodes.update({f"w{i}": {"kind": "worker"} for i in range(n)})
    links = [{"endpoints": [f"w{i}", f"leaf{i // per_leaf}"]} for i in range(n)]
    links += [{"endpoints": [f"leaf{j}", "core"], "bottleneck": True} for j in range(leaves)]
    return {"name": name, "defaults": {"link": {"rate": rate}}, "nodes": nodes, "links": links}


def three_switch(name: str, workers: set[str] | None = None) -> dict:
    """topologies/three_switch.yaml named ``name``, with only ``workers`` (all eight when None)."""
    import yaml

    topo = yaml.safe_load((Path(__file__).resolve().parents[1] / "testbed" / "topologies" /
                           "three_switch.yaml").read_text())
    topo["name"] = name
    if workers is not None:
        topo["nodes"] = {n: v for n, v in topo["nodes"].items() if v["kind"] == "switch" or n in workers}
        topo["links"] = [lk for lk in topo["links"] if set(lk["endpoints"]) <= set(topo["nodes"])]
    return topo


def await_line(proc, text: bytes, timeout: float) -> None:
    """Read ``proc``'s stdout until a line holds ``text`` (then leave the rest unread)."""
    import select

    deadline = time.monotonic() + timeout
    buf = b""
    fd = proc.stdout.fileno()
    while text not in buf:
        left = deadline - time.monotonic()
        if left <= 0 or proc.poll() is not None:
            raise RuntimeError(f"iperf3 server did not start: {buf.decode(errors='replace')[-500:]}")
        if select.select([fd], [], [], min(left, 0.5))[0]:
            buf += os.read(fd, 4096)


def iperf3(tb, seconds: float, *extra: str, server: str = "w1", client: str = "w0") -> dict:
    """One iperf3 TCP test client -> server inside a testbed; iperf3's JSON result."""
    srv = tb.spawn(server, ["iperf3", "-s", "-1", "--forceflush", "-B", tb.address(server)],
                   stdout=subprocess.PIPE)
    await_line(srv, b"Server listening", 30)  # on another host: after SSH and the relay start
    try:
        r = tb.exec(client, ["iperf3", "-c", tb.address(server), "-t", str(seconds), "-J", *extra],
                    capture_output=True, text=True, timeout=seconds + 30)
        if r.returncode != 0:
            raise RuntimeError(f"iperf3 failed: {r.stdout[-2000:]}{r.stderr}")
        return json.loads(r.stdout)
    finally:
        try:  # -1: it ends after the one test (a node on another host: its relay ends with it)
            srv.wait(timeout=5)
        except subprocess.TimeoutExpired:
            srv.kill()
            srv.wait()


class TcSampler:
    """Samples one link direction's tc byte counter every ``every`` seconds in a thread
    (``with TcSampler(ep) as s: ...``); ``rate_between(t0, t1)`` is the wire rate in bit/s
    between two monotonic times, from the first and last samples inside them.

    A sample is stamped with the middle of its read, and one whose read took over
    ``SLOW_READ_S`` is dropped: on a loaded machine the thread can stall between taking the
    time and reading the counter, and a sample 60 ms younger than its stamp made one second
    of a 50 Mbit/s flow read 53 Mbit/s."""

    SLOW_READ_S = 0.02

    def __init__(self, ep, every: float = 0.05):
        import threading

        self.ep, self.every = ep, every
        self.samples: list[tuple[float, int]] = []
        self.slow = 0
        """Samples dropped for a slow read."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        from testbed.net import tc
        from testbed.net.rtnl import Rtnl

        with Rtnl.open(self.ep.ns) as rt:
            idx = rt.index(self.ep.ifname)
            while not self._stop.is_set():
                t0 = time.monotonic()
                n = tc.egress_stats(rt)[idx]["bytes"]
                t1 = time.monotonic()
                if t1 - t0 <= self.SLOW_READ_S:
                    self.samples.append(((t0 + t1) / 2, n))
                else:
                    self.slow += 1
                time.sleep(self.every)

    def __enter__(self) -> "TcSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def rate_between(self, t0: float, t1: float) -> float:
        pts = [(t, b) for t, b in self.samples if t0 <= t <= t1]
        (ta, ba), (tb, bb) = pts[0], pts[-1]
        return (bb - ba) * 8 / (tb - ta)

    def recent_rate(self, seconds: float) -> float:
        """The wire rate in bit/s over the last ``seconds`` (0.0 until samples span most of them):
        for polling until a flow is up to speed."""
        pts = [(t, b) for t, b in self.samples if t >= time.monotonic() - seconds]
        if len(pts) < 2 or pts[-1][0] - pts[0][0] < 0.8 * seconds:
            return 0.0
        return (pts[-1][1] - pts[0][1]) * 8 / (pts[-1][0] - pts[0][0])


def pids_with(prefix: str) -> list[int]:
    """Pids of the processes one of whose arguments starts with ``prefix`` (a testbed marker:
    ``--replay-id=``, ``--logfile=``) that this pytest-xdist worker started (:func:`started_here`)."""
    from testbed.common.procs import argv_of

    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()
            and any(a.startswith(prefix) for a in argv_of(int(p.name))) and started_here(int(p.name))]


def environ_of(pid: int) -> list[bytes] | None:
    """``pid``'s environment as ``NAME=VALUE`` entries; None for a process gone meanwhile
    (or not ours to read)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f.read().split(b"\0")
    except OSError:
        return None


def started_here(pid: int) -> bool:
    """Under pytest-xdist: whether ``pid``'s environment names this worker. The README's
    command runs the unit and workload tests and a second kernel lane (tests/lanes.py) beside
    a kernel test, and what they start (ranks, iperf3 flows, replays: testbed passes its
    environment on; a user's run under ``env -i`` carries no worker at all) is not that
    test's. Outside xdist every live process counts. False for a process gone meanwhile."""
    env = environ_of(pid)
    if env is None:
        return False
    me = os.environ.get("PYTEST_XDIST_WORKER")
    return me is None or f"PYTEST_XDIST_WORKER={me}".encode() in env


def finish(p: subprocess.Popen, timeout: float) -> tuple[str, float]:
    """``p``'s stderr and how long it took to end (killed if it outlives ``timeout``)."""
    t0 = time.monotonic()
    try:
        _, err = p.communicate(timeout=timeout)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    return err, time.monotonic() - t0


FREEZER = Path("/sys/fs/cgroup/freezer")


def running(pid: int) -> bool:
    """``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def has_freezer() -> bool:
    return (FREEZER / "freezer.state").exists() or (FREEZER / "cgroup.procs").exists()


class Frozen:
    """Process ``pid`` in a cgroup-v1 freezer cgroup of its own (frozen until :meth:`thaw`):
    neither SIGTERM nor SIGKILL ends it meanwhile, as with a process stuck in the kernel."""

    def __init__(self, pid: int):
        self.pid, self.cg = pid, FREEZER / f"testbed-test-{os.getpid()}-{pid}"
        self.cg.mkdir()
        (self.cg / "cgroup.procs").write_text(str(pid))
        (self.cg / "freezer.state").write_text("FROZEN")
        deadline = time.monotonic() + 10
        while (self.cg / "freezer.state").read_text().strip() != "FROZEN" and time.monotonic() < deadline:
            time.sleep(0.05)

    def thaw(self) -> None:
        """Thaw, wait for the process to act on a pending SIGKILL (if any), remove the cgroup."""
        (self.cg / "freezer.state").write_text("THAWED")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                self.cg.rmdir()  # refused while it holds a task (an exited one until it is reaped, too)
                return
            except OSError:
                pass
            if running(self.pid) and time.monotonic() > deadline - 5:  # the test failed before down: it goes
                try:
                    (FREEZER / "cgroup.procs").write_text(str(self.pid))
                except OSError:
                    pass
            time.sleep(0.1)
        print(f"could not remove {self.cg}")


def agent_frames(sock, thread, idle: float | None = None) -> list:
    """The frames a VM guest agent answered on ``sock`` up to its EXIT or ERROR; then the
    socket is closed and the agent's ``thread`` joined."""
    from testbed.nodes.vm import agent as wire

    frames = []
    while (f := wire.recv(sock, **({} if idle is None else {"idle": idle}))) is not None:
        frames.append(f)
        if f[0] in (wire.EXIT, wire.ERROR):
            break
    sock.close()
    thread.join(10)
    return frames


@contextlib.contextmanager
def ordinary_user(name: str):
    """An ordinary user ``name`` (made with useradd unless it exists): its passwd entry;
    afterwards its processes are killed and, if made here, it is removed."""
    import pwd

    made = False
    try:
        pwd.getpwnam(name)
    except KeyError:
        subprocess.run(["useradd", "--create-home", "--shell", "/bin/sh", name], check=True)
        made = True
    try:
        yield pwd.getpwnam(name)
    finally:
        subprocess.run(["pkill", "-9", "-u", name], capture_output=True)
        if made:
            subprocess.run(["userdel", "--remove", name], capture_output=True)


def user_processes(user: str) -> list[str]:
    """The user's live processes (zombies excluded: they hold nothing), as ``pid args``."""
    import pwd

    uid = pwd.getpwnam(user).pw_uid
    out = []
    for e in os.scandir("/proc"):
        if e.name.isdigit():
            try:
                if os.stat(e.path).st_uid != uid:
                    continue
                with open(f"{e.path}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                        continue
                with open(f"{e.path}/cmdline", "rb") as f:
                    args = f.read().replace(b"\0", b" ").decode(errors="replace")
                out.append(f"{e.name} {args}")
            except (OSError, IndexError):
                continue
    return out


def user_processes_left(user: str, timeout: float = 15.0) -> list[str]:
    """The user's processes still there once they had ``timeout`` seconds to end (none: [])."""
    deadline = time.monotonic() + timeout
    while (left := user_processes(user)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def tensorboard_scalars(folder) -> dict[str, list[tuple[int, float, float]]]:
    """Every scalar of the TensorBoard event files in ``folder``, read back by TensorBoard's own
    reader (all of them: no reservoir sampling): tag -> [(step, value, wall time)]."""
    from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator

    acc = EventAccumulator(str(folder), size_guidance={SCALARS: 0})
    acc.Reload()
    return {tag: [(e.step, e.value, e.wall_time) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def records_as_scalars(run_dir) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """What a run's records say TensorBoard should show (independently of testbed's writer):
    folder -> tag -> [(step, value)], from rank*.jsonl, eval.jsonl and links.jsonl."""
    from pathlib import Path

    tags = {"loss": "train/loss", "iter_s": "iteration/seconds", "compute_s": "iteration/compute_seconds",
            "comm_s": "iteration/comm_seconds", "overlap_s": "iteration/overlap_seconds",
            "payload_bytes": "payload/bytes", "tx_bytes": "interface/tx_bytes", "rx_bytes": "interface/rx_bytes"}
    run_dir, out = Path(run_dir), {}
    for f in sorted(run_dir.glob("rank*.jsonl")):
        folder = out.setdefault(f.stem, {})
        for r in map(json.loads, f.read_text().splitlines()):
            for k, tag in tags.items():
                if isinstance(r.get(k), (int, float)):
                    folder.setdefault(tag, []).append((r["iter"], float(r[k])))
    for e in map(json.loads, (run_dir / "eval.jsonl").read_text().splitlines()):
        out.setdefault("eval", {}).setdefault("eval/accuracy", []).append((e["iter"], e["accuracy"]))
    n: dict = {}
    for s in map(json.loads, (run_dir / "links.jsonl").read_text().splitlines()):
        key = f"links/{s['link']}/{s['direction']}"
        n[key] = n.get(key, 0) + 1
        out.setdefault("links", {}).setdefault(f"{key}/utilisation", []).append((n[key], s["utilisation"]))
    return out


BROKEN = {"pyproject.toml": '[build-system]\nrequires = ["setuptools>=61"]\nbuild-backend = "setuptools.build_meta"\n'
                            '[project]\nname = "testbed-broken-plugin"\nversion = "0.1"\n'
                            '[project.entry-points."testbed.backends"]\nbroken = "broken_testbed:Backend"\n'
                            '[project.entry-points."testbed.schemes"]\nbrokenscheme = "broken_testbed_gone:attach"\n'
                            '[tool.setuptools]\npy-modules = ["broken_testbed"]\n',
          "broken_testbed.py": "raise ImportError('this plugin is broken on purpose')\n"}


def venv_with_plugins(tmp_path) -> Path:
    """A fresh venv holding the toy plugin (examples/plugin) and a broken one, pip-installed
    from their source trees; torch, testbed and the rest come from this venv (a .pth), which
    never sees the plugins. Its ``bin/testbed`` is what pip writes for a console script."""
    import sysconfig

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    site = next((venv / "lib").glob("python3*/site-packages"))
    (site / "_testbed_base.pth").write_text(f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\n")
    toy = shutil.copytree(Path(__file__).resolve().parents[1] / "examples" / "plugin", tmp_path / "toy")
    broken = tmp_path / "broken"
    broken.mkdir()
    for name, text in BROKEN.items():
        (broken / name).write_text(text)
    r = subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q",
                        "--no-deps", "--no-build-isolation", "--no-index", str(toy), str(broken)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    exe = venv / "bin" / "testbed"
    exe.write_text(f"#!{venv / 'bin' / 'python'}\nimport sys\nfrom testbed.cli import main\nsys.exit(main())\n")
    exe.chmod(0o755)
    return exe
