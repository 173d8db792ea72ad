"""Teardown and recovery: ``down`` from the ledger, ``down --all``, and listing testbeds.

``down NAME`` reads NAME's ledger, turns each entry back into its action and undoes them
newest first (:mod:`testbed.plan.actions` explains the two passes). It never guesses from name
patterns. An entry is untrusted input: it must parse as a registered action, and any
namespace it names must be one this testbed's plan could have made (``NAME`` or
``NAME.NODE``); anything else is reported and left alone.

``down --all`` does that for every ledger in the state directory, then recovers what a
lost ledger would hide: namespaces whose loopback carries a ``testbed:NAME@ID`` tag with
this state directory's ID, the exporters of those testbeds (by their target files in
this state directory), containers labelled with this state directory, and the cgroups
named after this state directory's ID (with what runs in them: :mod:`testbed.nodes.cgroup`). Namespaces
without a tag, or tagged by another state directory, are never touched.
"""

from __future__ import annotations

import atexit
import os
from collections.abc import Callable
from typing import Protocol, cast

from testbed.plan import actions, naming
from testbed.common import procs
from testbed.common.errors import KernelError, StateError, TestbedError
from testbed.hosts import share  # noqa: F401  (registers other hosts' actions, named in ledgers)
from testbed.hosts.local import LocalHost
from testbed.nodes import BACKENDS  # (importing the backends registers their actions, named in ledgers)
from testbed.nodes import cgroup
from testbed.plan import tunnel_action  # noqa: F401  (registers StartTunnel, named in ledgers)
from testbed.plan.ledger import Ledger
from testbed.common import rootless
from testbed.common.state import global_lock
from testbed.net import netns
from testbed.net.rtnl import Rtnl


def require_root() -> None:
    """Root, or an ordinary user inside their rootless namespaces. An ordinary user's process
    outside them (the library in a program of theirs, `testbed validate`) enters them here
    (:func:`testbed.common.rootless.enter`: the process forks, the rest of the program runs
    in the child, inside them, and the parent exits with its status; call it before the
    program starts threads); when the program ends, the namespaces' holder is stopped if no
    testbed is left up, as after a `testbed` command."""
    if os.geteuid() != 0 and rootless.needed():
        rootless.enter()
        atexit.register(lambda: rootless.release(busy=bool(list_testbeds())))
    if os.geteuid() != 0:
        raise TestbedError("building a testbed needs root, or an ordinary user's rootless namespaces "
                           "(network namespaces, veth, tc)",
                           "run it through the `testbed` command, which enters them; in Python, call "
                           "testbed.common.rootless.enter() first")


class _MakesNamespace(Protocol):
    ns: str


def created_namespace(action: actions.Action) -> str:
    """The namespace an action whose ``creates_namespace`` is true makes: its ``ns`` field
    (such an action has one, as :class:`testbed.plan.base.Action` says)."""
    return cast(_MakesNamespace, action).ns


def _namespaces_of(action: actions.Action) -> list[str]:
    return [v for k in ("ns", "peer_ns") if isinstance(v := getattr(action, k, None), str)]


def teardown(name: str, notes: list[str] | None = None) -> list[str]:
    """Undo everything in ``name``'s ledger, newest first, then remove whatever still carries
    this testbed's tag or labels (what a damaged, truncated or emptied ledger no longer
    lists); return the failures. ``notes`` gets what the user should hear of: damaged
    ledger lines, and leftovers the ledger did not list."""
    ledger = Ledger(name)
    todo: list[actions.Action] = []
    problems: list[str] = []
    damaged: list[str] = []
    for e in ledger.entries(damaged):
        try:
            a = actions.from_dict(e)
        except StateError as err:
            problems.append(err.message)
            continue
        bad = [ns for ns in _namespaces_of(a) if not naming.owned_namespace(name, ns)]
        if bad:
            problems.append(f"ledger entry {type(a).__name__} names namespace {bad[0]!r}, which testbed "
                            f"'{name}' cannot have made; left alone")
            continue
        todo.append(a)
    host = LocalHost()
    if ledger.exists():
        ledger.mark_going()
    td = actions.Teardown(name, {created_namespace(a) for a in todo if a.creates_namespace}, host)
    try:
        for a in reversed(todo):
            _guarded(td, a, a.release)
        try:
            host.kill_processes(td.kill_in)
        except TestbedError as err:  # a straggler: its namespace stays, and the ledger with it
            td.problems.append(err.message)
        for a in reversed(todo):
            _guarded(td, a, a.undo)
    finally:
        host.close()
    problems += td.problems
    if not problems:
        # what a damaged or lost line named is unknown: remove whatever still carries this
        # testbed's tag or labels (namespaces, containers), then the ledger can go
        swept = _recover({name}, problems)
        if notes is not None:
            notes += damaged
            if swept:
                notes.append(f"testbed '{name}' had namespaces or containers its ledger did not list (a damaged "
                             "or truncated ledger); they were found by their tags and removed")
    if not problems:
        ledger.remove()
    elif ledger.exists():
        ledger.mark_going(False)  # still (partly) up: runs on it are not told it went
    return problems


def _guarded(td: actions.Teardown, action, step) -> None:
    try:
        step(td)
    except (TestbedError, OSError) as err:
        td.problems.append(f"{type(action).__name__} {getattr(action, 'ns', '')}: {err}".replace("  ", " "))


def down(name: str, say: Callable[[str], None] | None = None) -> bool:
    """Tear down testbed ``name``; False if it was not up. Idempotent. ``say`` hears
    warnings (a damaged ledger line, leftovers it did not list)."""
    require_root()
    notes: list[str] = []
    if not Ledger(name).exists():
        return False
    try:
        lock = Ledger(name).lock()  # its own lock only: other testbeds' up and down go on meanwhile
    except StateError:
        return False  # removed meanwhile
    with lock:  # a build or link change in flight ends first
        if not Ledger(name).exists():
            return False  # another down removed it meanwhile
        problems = teardown(name, notes)
    for note in notes:
        if say is not None:
            say(f"warning: {note}")
    if problems:
        for p in problems:  # each process that outlived it on a line of its own
            if say is not None and p.startswith("could not end "):
                say(p)
        raise KernelError(f"could not remove everything of '{name}': " + "; ".join(problems),
                          f"fix the cause and run `testbed down {name}` again")
    return True


def down_all() -> list[str]:
    """Tear down every testbed in the state dir, then whatever a lost ledger left behind. It
    holds the global lock throughout: no testbed is reserved meanwhile, so what it recovers
    by tags is only what lost its ledger (it waits for a build in flight to end first)."""
    require_root()
    removed: list[str] = []
    problems: list[str] = []
    with global_lock():
        for name in Ledger.all_names():
            with Ledger(name).lock():
                p = teardown(name)
            problems += p
            if not p:
                removed.append(name)
        for owner in _recover(None, problems):
            if owner not in removed:
                removed.append(owner)
    if problems:
        raise KernelError("could not remove everything: " + "; ".join(problems))
    return removed


def _recover(names: set[str] | None, problems: list[str]) -> list[str]:
    """Remove what testbeds ``names`` (None: any) left without a readable ledger entry:
    containers labelled with this state directory, namespaces tagged ``testbed:NAME``
    and those testbeds' exporters. Returns the testbeds found."""
    from testbed.monitor.sd import testbed_target

    found = [owner for backend in BACKENDS.values() for owner in backend.recover(names, problems)]
    found += cgroup.sweep(names, problems)  # and what was started in their nodes, wherever it went
    orphans: dict[str, list[str]] = {}
    mine = naming.state_id()
    for ns in netns.list_all():
        try:
            with Rtnl.open(ns) as rt:
                owner = naming.testbed_of_tag(rt.lo_alias(), mine)
        except TestbedError:
            continue
        if owner and (names is None or owner in names):
            orphans.setdefault(owner, []).append(ns)
    for owner, nss in orphans.items():
        target = testbed_target(owner)  # its exporter, if the lost ledger had started one
        try:
            procs.stop(procs.with_arg(f"--sd-file={target}"), f"testbed {owner}'s link exporter")
            target.unlink(missing_ok=True)
            netns.stop_processes(nss, f"processes in testbed {owner}'s nodes")
        except TestbedError as e:
            problems.append(e.message)
            continue
        for backend in BACKENDS.values():  # e.g. a VM's state directory, outside its namespace
            backend.forget(nss)
        for ns in nss:
            try:
                netns.remove(ns)
            except TestbedError as e:
                problems.append(str(e))
        found.append(owner)
    return list(dict.fromkeys(found))


def list_testbeds() -> list[dict]:
    """Every testbed of the state directory, each field of the type it should have: a
    damaged state file shows as not ready with what could be read, never a crash."""
    out = []
    for name in Ledger.all_names():
        st = Ledger(name).read_state() or {}
        nodes, topology = _of(st, "nodes", dict, {}), _of(st, "topology", dict, {})
        out.append({
            "name": name,
            "ready": _of(st, "ready", bool, False),
            "created": _of(st, "created", str, None),
            "workers": sum(1 for n in nodes.values() if isinstance(n, dict) and n.get("kind") == "worker"),
            "links": len(_of(topology, "links", list, [])),
            "source": _of(st, "source", str, None),
        })
    return out


def _of(d: dict, key: str, kind: type, default):
    v = d.get(key, default)
    return v if isinstance(v, kind) else default
