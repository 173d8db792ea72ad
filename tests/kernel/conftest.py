"""Kernel tests: real namespaces, veth, bridges and tc. Need root; skipped otherwise."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from tests import lanes
from tests.helpers import started_here

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
    root on another xdist worker, beside the kernel tests, and remove it themselves.

    Under pytest-xdist, where two kernel lanes run side by side (tests/lanes.py), each sees
    its own (:func:`_lane_view`)."""
    links = run(["ip", "-o", "link", "show"]).stdout
    snap = {
        "netns": sorted(ns for ns in netns_names() if not _probing_elsewhere(ns)),
        "links": sorted(l.split(":")[1].strip().split("@")[0] for l in links.splitlines()),
        "qdiscs": sorted(run(["tc", "qdisc", "show"]).stdout.splitlines()),
    }
    return _lane_view(snap) if os.environ.get("PYTEST_XDIST_WORKER") else snap


def netns_names() -> list[str]:
    """The named namespaces, from `ip netns list` (a line is ``NAME`` or ``NAME (id: N)``)."""
    return [line.split()[0] for line in run(["ip", "netns", "list"]).stdout.splitlines() if line.strip()]


# the names testbed gives interfaces (testbed.plan.naming), were one to leak into the host's namespace
_TESTBED_IFNAME = re.compile(r"sw\d+|[lt]\d+[ab]")


def _lane_view(snap: dict) -> dict:
    """``snap`` as the current test's lane sees it. The main lane: all but the waiting lane's
    Slurm lab and the namespaces testbeds of other state directories tag (the waiting lane's
    testbeds). The waiting lane, which shares the host with the main lane's labs, Docker and
    crash tests: only its Slurm lab, the namespaces its own state directory's testbeds tag,
    and the host links a testbed could name (one that leaked out of its namespace)."""
    test = os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0]
    own = state_id_of_env()
    if lanes.unit(test) == lanes.WAITING_UNIT:
        keep = lambda name: lanes.waiting_host_name(name) or _TESTBED_IFNAME.fullmatch(name) is not None  # noqa: E731
        netns = [ns for ns in snap["netns"] if lanes.waiting_host_name(ns) or _tag_owner(ns) == own]
    else:
        keep = lambda name: not lanes.waiting_host_name(name)  # noqa: E731
        netns = [ns for ns in snap["netns"] if keep(ns) and _tag_owner(ns) in (own, None)]
    return {"netns": netns, "links": [name for name in snap["links"] if keep(name)],
            "qdiscs": [q for q in snap["qdiscs"] if keep(q.split(" dev ", 1)[-1].split(" ", 1)[0])]}


def state_id_of_env() -> str:
    """The id of the state directory this test's testbed commands use (TESTBED_STATE_DIR)."""
    from testbed.plan.naming import state_id

    return state_id(os.environ.get("TESTBED_STATE_DIR"))


def _tag_owner(ns: str) -> str | None:
    """The state id in the tag testbed put on ``ns`` (its loopback's alias), read with
    iproute2; None for a namespace without one (or gone meanwhile)."""
    from testbed.plan import naming

    r = subprocess.run(["ip", "-n", ns, "-o", "link", "show", "lo"], capture_output=True, text=True)
    alias = r.stdout.split(" alias ", 1)[1].split()[0] if " alias " in r.stdout else ""
    found = naming.owner_of_tag(alias)
    return found[1] if found else None


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
    owner = _tag_owner(ns)
    return owner is not None and owner != own


def _passers_by(before: list[str], after: list[str], own: str) -> set[str]:
    """Under xdist's two kernel lanes: the namespaces in one snapshot and not the other that
    are the other lane's, caught untagged (being made: testbed tags a namespace just after
    it makes it; or removed since). One gone since the first snapshot is not this test's
    leftover; one new is looked at again for up to 2 s, until it is tagged by another state
    directory or gone (it stays a leftover if it is untagged or this test's)."""
    passing = set(before) - set(after)
    new = set(after) - set(before)
    deadline = time.monotonic() + 2
    while new:
        gone = set(new) - set(netns_names())
        settled = gone | {ns for ns in new - gone if _tagged_by_another(ns, own)}
        passing |= settled
        new -= settled
        if not new or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    return passing


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
    if os.environ.get("PYTEST_XDIST_WORKER"):
        others |= others_before | _passers_by(before["netns"], after["netns"], own)
        others_before = others
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
    """``pgrep -f pattern``, under pytest-xdist only the processes this worker started
    (``tests.helpers.started_here``): the README's command runs the unit and workload tests,
    ``python -m workloads.train`` among them, and the other kernel lane beside a kernel test
    (measured: a bare ``pgrep -f workloads.train`` saw their ranks and failed)."""
    return [pid for pid in map(int, run(["pgrep", "-f", pattern]).stdout.split()) if started_here(pid)]


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
