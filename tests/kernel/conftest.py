"""Kernel tests: real namespaces, veth, bridges and tc. Need root; skipped otherwise."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

if os.geteuid() != 0:
    pytest.skip("kernel tests need root (network namespaces, veth, tc)", allow_module_level=True)

# The Ctrl-C tests send SIGINT to `testbed run`, which (like any Python program) only turns
# it into KeyboardInterrupt if SIGINT was not ignored when it started. A suite launched as a
# background job of a non-interactive shell inherits SIGINT ignored and would pass that on to
# every child; a handler here makes the children start with the default instead.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def run(argv, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, **kw)


def cli(*args: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    e = dict(os.environ)
    if env:
        e.update(env)
    return run([sys.executable, "-m", "testbed.cli", *args], env=e, timeout=timeout)


def cli_json(*args: str, **kw) -> dict:
    r = cli(*args, "--json", **kw)
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout)


def kernel_snapshot() -> dict:
    """What a testbed could leave behind, seen with iproute2 (not with testbed's own code).
    The throwaway namespace of a kernel probe (testbed.net.probe) still under way in a
    live process other than this one is not counted: the unit tests' CLI runs probe as
    root on another xdist worker, beside the kernel tests, and remove it themselves."""
    links = run(["ip", "-o", "link", "show"]).stdout
    return {
        "netns": sorted(ns for ns in run(["ip", "netns", "list"]).stdout.split() if not _probing_elsewhere(ns)),
        "links": sorted(l.split(":")[1].strip().split("@")[0] for l in links.splitlines()),
        "qdiscs": sorted(run(["tc", "qdisc", "show"]).stdout.splitlines()),
    }


def _probing_elsewhere(ns: str) -> bool:
    prefix = "testbed-probe-"
    pid = ns[len(prefix):] if ns.startswith(prefix) else ""
    return pid.isdigit() and int(pid) != os.getpid() and os.path.exists(f"/proc/{pid}")


def state_id_of(tmp_path) -> str:
    from testbed.plan.naming import state_id

    return state_id(tmp_path / "state")


def _tagged_by_another(ns: str, own: str) -> bool:
    """``ns`` carries testbed's tag (its loopback's alias) for a state directory other than
    ``own``: read with iproute2, as the rest of the snapshot."""
    from testbed.plan import naming

    r = subprocess.run(["ip", "-n", ns, "-o", "link", "show", "lo"], capture_output=True, text=True)
    alias = r.stdout.split(" alias ", 1)[1].split()[0] if " alias " in r.stdout else ""
    return alias.startswith(naming.TAG_PREFIX) and naming.testbed_of_tag(alias, own) is None


@pytest.fixture
def clean_kernel(tmp_path, monkeypatch):
    """A private state dir; asserts the kernel looks exactly as before when the test ends."""
    monkeypatch.setenv("TESTBED_STATE_DIR", str(tmp_path / "state"))
    before = kernel_snapshot()
    own = state_id_of(tmp_path)
    # another state directory's testbed (someone else's, on a shared development machine)
    # that was up when the test began, or came up meanwhile, is neither this test's leftover
    # nor this test's to remove, and it may go while the test runs
    others_before = {ns for ns in before["netns"] if _tagged_by_another(ns, own)}
    yield {**before, "state_dir": str(tmp_path / "state")}
    after = kernel_snapshot()
    others = {ns for ns in after["netns"] if ns not in before["netns"] and _tagged_by_another(ns, own)}
    others |= {ns for ns in after["netns"] if ns in others_before}
    after["netns"] = [ns for ns in after["netns"] if ns not in others]
    before = {**before, "netns": [ns for ns in before["netns"] if ns not in others_before]}
    leftover = [ns for ns in after["netns"] if ns not in before["netns"]]
    if leftover:  # clean up for the next test, then fail this one
        for ns in leftover:
            run(["ip", "netns", "del", ns])
    assert after == before, f"left behind: {leftover or after}"
    state = tmp_path / "state"
    from testbed.common import cgroups
    from testbed.plan.naming import state_id

    groups = cgroups.of_state(state_id(str(state)))
    for group in groups.values():  # clean up for the next test (ending what runs in them), then fail this one
        cgroups.remove(group)
    assert not groups, f"cgroups left behind: {sorted(map(str, groups.values()))}"
    strays = _processes_naming(str(state))
    for pid in strays:  # clean up for the next test, then fail this one
        os.kill(pid, 9)
    assert not strays, f"processes left behind: {strays}"
    left = {p.name for p in state.iterdir()} if state.exists() else set()
    assert left <= {".lock", "targets", "monitors"}, f"state left behind: {left}"
    for d in ("targets", "monitors"):  # directories Prometheus watches may stay, empty
        assert not (state / d).exists() or not list((state / d).iterdir()), f"files left in {state / d}"


def pids_of_this_session(pattern: str) -> list[int]:
    """``pgrep -f pattern``, less the processes that another pytest-xdist worker started (their
    environment names that worker): the README's command runs the unit and workload tests,
    ``python -m workloads.train`` among them, beside the kernel tests. Every other match counts,
    whoever started it."""
    me = f"PYTEST_XDIST_WORKER={os.environ.get('PYTEST_XDIST_WORKER', '')}".encode()
    out = []
    for pid in map(int, run(["pgrep", "-f", pattern]).stdout.split()):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:  # gone meanwhile
            continue
        if not any(e.startswith(b"PYTEST_XDIST_WORKER=") and e != me for e in env):
            out.append(pid)
    return out


def _processes_naming(text: str) -> list[int]:
    """Host processes with ``text`` in their command line (exporters name their target file)."""
    out = []
    for e in os.scandir("/proc"):
        if e.name.isdigit() and int(e.name) != os.getpid():
            try:
                with open(f"/proc/{e.name}/cmdline", "rb") as f:
                    if text.encode() in f.read():
                        out.append(int(e.name))
            except OSError:
                pass
    return out


# ---------------------------------------------------------------- the sshd hosts of the multi-host tests
@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    from . import sshhosts

    lab = sshhosts.build(tmp_path_factory.mktemp("lab"), 2)
    try:
        yield lab
    finally:
        sshhosts.destroy(lab)


@pytest.fixture
def clean_lab(lab, clean_kernel):
    """Every host as bare after the test as before (namespaces, ledgers), and the local kernel too."""
    assert lab.leftovers() == {}
    yield lab
    for h in lab.hosts:  # a fault test may have left a host cut off
        h.cut(False)
    left = lab.leftovers()
    assert left == {}, f"left on hosts: {left}"
