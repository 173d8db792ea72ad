"""A host's side of a multi-host testbed: ``testbed _host OP ...`` run over SSH.

The controller (the machine where ``testbed up`` runs) plans the whole testbed, then
hands each remote host its share; that host applies the share with its *own* ledger and
state directory, so ``testbed down NAME`` on it (from the controller over SSH, or typed
there) removes exactly what it made, also after the controller died halfway. Every
operation answers one JSON object on stdout (errors: ``{"error", "hint", "type"}``, exit 1).

Operations (payloads are JSON on stdin, read as untrusted input):

``probe``      checks before anything is made: root, same version, the underlay address
               is this host's and its MTU carries the tunnel, names free, backends ready.
``apply NAME`` {state, actions}: record and apply this host's actions; undo all on failure.
               If the SSH connection dies meanwhile (the controller was killed), the share
               removes itself (PR_SET_PDEATHSIG makes that a SIGTERM). ``--hold``: then
               stay until the share is removed (a Slurm step's processes end with it);
               on SIGTERM/SIGHUP (the job's end) remove the share, as ``down NAME``.
``down NAME``  / ``down-all``: as ``testbed down`` here. ``guard NAME``: stay, as ``--hold``
               does, for a testbed built here by a controller on a node of a Slurm job.
``counters NAME``: egress counters of this host's link ends.
``shape NAME`` {changes: [{link, direction, shape}]}: change this host's link ends.
``exec NAME NODE -- ARGV``: run ARGV in the node, killed if the connection dies.
``why NAME`` {node}: why a process in that node (on this host) may have stopped, as its
               backend tells here (its container removed, its VM gone quiet); served only.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import ipaddress
import json
import os
import signal
import subprocess
import sys

from testbed.common.version import __version__
from testbed.engine import plugins
from testbed.net.underlay import check_underlay
from testbed.monitor import sd
from testbed.plan import naming
from testbed.common.digits import ascii_int
from testbed.common.errors import StateError, TestbedError


def die_with_connection(sig: int) -> None:
    """Get ``sig`` when sshd's session (our parent: the command line starts with exec) ends."""
    from testbed.nodes.nsexec import PR_SET_PDEATHSIG, _libc

    _libc.prctl(PR_SET_PDEATHSIG, sig)
    if os.getppid() == 1:
        raise StateError("the SSH connection that started this is gone")


MAX_REQUEST = 64 << 20
"""A request's bound (an ``apply`` carries a share of the plan and the state)."""

SERVED = {
    "counters": lambda name, payload: counters(name),
    "shape": lambda name, payload: shape(name, dict_of(payload, "request")),
    "why": lambda name, payload: why(name, dict_of(payload, "request")),
}
"""What ``testbed _host serve`` answers: the requests a controller repeats (:mod:`testbed.engine.hostserve`)."""


def _payload() -> object:
    data = sys.stdin.buffer.read(MAX_REQUEST + 1)
    if len(data) > MAX_REQUEST:
        raise TestbedError(f"the request is longer than {MAX_REQUEST} bytes")
    try:
        return json.loads(data or b"null")
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise TestbedError(f"the request is not JSON: {e}") from None


def dict_of(v: object, what: str) -> dict:
    if not isinstance(v, dict):
        raise TestbedError(f"the request's {what} is not a JSON object")
    return v


def probe(req: dict) -> dict:
    from testbed.engine.preflight import check_free, check_share
    from testbed.model.topology import load_topology_dict

    if os.geteuid() != 0:
        raise StateError(f"this host runs testbed as uid {os.geteuid()}, not root",
                         "log in as root (hosts[].user: root); testbed makes namespaces and qdiscs there")
    if req.get("version") != __version__:
        raise StateError(f"this host has testbed {__version__}, the controller {req.get('version')}",
                         "install the same version on every host")
    topo = load_topology_dict(req.get("topology"))
    me = req.get("host")
    if not isinstance(me, str):
        raise TestbedError("the request names no host")
    check_share(topo, me)
    if isinstance(req.get("underlay"), str) and isinstance(req.get("mtu"), int):
        check_underlay(req["underlay"], req["mtu"], "underlay")
    check_free(ns for ns in req.get("namespaces") or [] if isinstance(ns, str))
    return {"version": __version__, "hostname": os.uname().nodename, "state_id": naming.state_id()}


def apply(name: str, req: dict) -> dict:
    """Record and apply this host's share (see the module's docstring)."""
    import dataclasses

    from testbed.plan import actions
    from testbed.engine.apply import apply_plan
    from testbed.engine.core import Testbed
    from testbed.engine.preflight import check_free
    from testbed.plan.ledger import Ledger
    from testbed.common.state import global_lock, state_root
    from testbed.plan.plan import Plan
    from testbed.engine.teardown import created_namespace, require_root

    require_root()
    state = dict_of(req.get("state"), "state")
    if state.get("name") != name:
        raise TestbedError("the request's state names another testbed")
    entries = req.get("actions")
    if not isinstance(entries, list):
        raise TestbedError("the request's actions are not a list")
    todo = []
    for e in entries:
        a = actions.from_dict(e)
        for ns in (getattr(a, k, None) for k in ("ns", "peer_ns")):
            if isinstance(ns, str) and not naming.owned_namespace(name, ns):
                raise StateError(f"action {type(a).__name__} names namespace {ns!r}, which '{name}' cannot own")
        fields = {f.name for f in dataclasses.fields(a)}
        changes: dict[str, str] = {}
        if "tag" in fields:
            changes["tag"] = naming.tag(name)  # this host's state directory owns it
        if "state" in fields:  # a container's label: a lost-ledger `down --all` here finds it
            changes["state"] = str(state_root())
        todo.append(dataclasses.replace(a, **changes) if changes else a)
    tb = Testbed(state)  # validates the state as the controller's own commands would
    subnet = ipaddress.ip_network(state["subnet"])
    if not isinstance(subnet, ipaddress.IPv4Network):
        raise TestbedError("the request's subnet is not an IPv4 network")
    exporter = req.get("exporter")
    if exporter is not None:  # checked before anything is recorded
        if not isinstance(exporter, str):
            raise TestbedError("the request's exporter is not HOST:PORT")
        sd.check_listen(exporter, "exporter", "HOST:PORT")
    die_with_connection(signal.SIGTERM)  # a dead controller: the share removes itself
    with contextlib.ExitStack() as building:
        with global_lock():  # only while the name is checked and reserved here
            if Ledger(name).exists():
                raise StateError(f"testbed '{name}' is already up here")
            check_free(created_namespace(a) for a in todo if a.creates_namespace)
            ledger = Ledger(name)
            ledger.create()
            state = {**state, "ready": False, "pid": os.getpid()}
            ledger.write_state(state)
            building.enter_context(ledger.lock())  # the share's build holds its own
        apply_plan(Plan(tb.topology, subnet, todo), ledger, state, schedules=False,
                   exporter=exporter)
    return {"applied": len(todo), "exporter": state.get("exporter")}


def down(name: str) -> dict:
    from testbed.engine.teardown import down as down_

    return {"removed": down_(name)}


def down_all() -> dict:
    from testbed.engine.teardown import down_all as down_all_

    return {"removed": down_all_()}


def counters(name: str) -> dict:
    from testbed.engine.core import Testbed

    tb = Testbed.attach(name)
    got = tb.link_counters(local_only=True)
    return {"counters": {f"{i}/{d}": c for (i, d), c in got.items()}}


def shape(name: str, req: dict) -> dict:
    """Change this host's ends of links, as the controller asks; on a failure the shapes in
    force before (``old``, as the controller knows them) are put back."""
    from testbed.engine.core import Testbed
    from testbed.hosts.site import ShapeChange
    from testbed.net.tcbatch import LinkChanger
    from testbed.model.topology import shape_from_dict

    tb = Testbed.attach(name)
    changes = req.get("changes")
    if not isinstance(changes, list):
        raise TestbedError("the request's changes are not a list")
    todo = []
    for c in changes:
        c = dict_of(c, "change")
        key = (c.get("link"), c.get("direction"))
        link, direction = key
        if not (isinstance(link, int) and isinstance(direction, str)) \
                or (ep := tb.egress.get((link, direction))) is None or ep.host != tb.here:
            raise TestbedError(f"link end {key} is not on this host")
        old = shape_from_dict(c["old"]) if "old" in c else tb.topology.links[link].shape(direction)
        todo.append(ShapeChange(link, direction, f"links[{link}] {direction}", ep, shape_from_dict(c.get("shape")), old))
    changer = LinkChanger()
    try:
        tb.site(tb.here).shape(todo, changer)
    finally:
        changer.close()
    copies = req.get("copies") or {}
    if copies:
        _keep_copies(tb, dict_of(copies, "copies"))
    return {"changed": len(todo), "copied": len(copies)}


def why(name: str, req: dict) -> dict:
    """The node's backend's reason a process in it stopped, asked here where the node lives."""
    from testbed.engine.core import Testbed

    tb = Testbed.attach(name)
    node = req.get("node")
    if not isinstance(node, str) or node not in tb.nodes:
        raise TestbedError(f"testbed '{name}' has no node {node!r}")
    info = tb.node(node)
    if info.host != tb.here:
        raise TestbedError(f"node {node} is on host {info.host}, not on this one")
    return {"why": tb.site(tb.here).why_stopped(info)}


def _keep_copies(tb, copies: dict) -> None:
    """This host's copy of the state gets the shapes the controller now has in force, so
    `testbed status` typed here shows them (each shape checked as a topology's would be)."""
    from dataclasses import replace

    from testbed.model.topology import DIRECTIONS, load_topology_dict, shape_from_dict
    from testbed.plan.ledger import Ledger

    with Ledger(tb.name).lock():  # this testbed's: a trace step here never waits for another's up
        ledger = Ledger(tb.name)
        state = ledger.read_state()
        if state is None:
            raise StateError(f"testbed '{tb.name}' is not up on this host")
        topo = load_topology_dict(state["topology"], source=state.get("source"))
        links = list(topo.links)
        for key, shapes in copies.items():
            shapes = dict_of(shapes, "copy")
            i = ascii_int(str(key))
            if i is None or i >= len(links) or set(shapes) - set(DIRECTIONS):
                raise TestbedError(f"the request's copy names no link of this testbed: {str(key)[:40]!r}")
            l = links[i]
            new = {d: shape_from_dict(dict_of(shapes[d], "shape")) if d in shapes else l.shape(d) for d in DIRECTIONS}
            links[i] = replace(l, forward=new["forward"], reverse=new["reverse"])
        state["topology"] = topo.with_links(links).to_dict()
        ledger.write_state(state)


RUN_ID_RE = __import__("re").compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


def run_dir(name: str, run: str, create: bool = False):
    """This host's directory for run ``run`` of testbed ``name`` (inside its state
    directory: ``down`` removes it; the controller collects what ranks write there)."""
    from testbed.common.files import private_dir
    from testbed.plan.ledger import Ledger

    if not RUN_ID_RE.fullmatch(run) or run in (".", ".."):
        raise TestbedError(f"invalid run id {run!r}")
    ledger = Ledger(name)
    if not ledger.exists():
        raise StateError(f"testbed '{name}' is not up on this host")
    d = ledger.dir / "runs" / run
    if create:
        private_dir(d)
    elif not d.is_dir():
        raise StateError(f"run {run} has no directory on this host")
    return d


def rundir(name: str, run: str) -> dict:
    return {"path": str(run_dir(name, run, create=True))}


def exec_(name: str, node: str, args: list[str]) -> int:
    """Run a command in ``node`` with this process's stdin/stdout/stderr; killed when the SSH
    connection dies (PR_SET_PDEATHSIG here, DIE_WITH_PARENT for what runs in the node).

    ``args``: ``[--python] [--run RUN] [--env K=V]... [--mount DIR]... -- ARGV``. ``--python``:
    ARGV is ``MODULE ARGS`` for the node's Python; ``--run``: the command starts in this
    host's directory of that run, which the node sees (with each ``--mount``) at that path."""
    import argparse
    from pathlib import Path

    from testbed.common import procs
    from testbed.engine.core import Testbed
    from testbed.nodes.nsexec import DIE_WITH_PARENT

    p = argparse.ArgumentParser(prog="testbed _host exec", add_help=False)
    p.add_argument("--python", action="store_true")
    p.add_argument("--run")
    p.add_argument("--env", action="append", default=[])
    p.add_argument("--mount", action="append", default=[])
    try:
        cut = args.index("--")
    except ValueError:
        raise TestbedError("usage: testbed _host exec NAME NODE [OPTIONS] -- ARGV...") from None
    opts, unknown = p.parse_known_args(args[:cut])
    argv = args[cut + 1:]
    if unknown or not argv:
        raise TestbedError(f"bad exec options {unknown!r}" if unknown else "no command")
    die_with_connection(signal.SIGTERM)
    tb = Testbed.attach(name)
    info = tb.node(node)
    if info.host != tb.here:
        raise TestbedError(f"node {node} is on host {info.host}, not on this one")
    backend = tb.backend(node)
    env = backend.environment(info)
    for kv in opts.env:
        k, sep, v = kv.partition("=")
        if not sep or not k or "\0" in kv:
            raise TestbedError(f"bad --env {kv!r}")
        env[k] = v
    mounts = [Path(m) for m in opts.mount]
    for m in mounts:
        if not m.is_absolute() or not m.is_dir():
            raise TestbedError(f"--mount {m}: not a directory on host {tb.here}",
                               "a path the command needs must exist on every host that runs it")
    cwd = None
    if opts.run is not None:
        cwd = run_dir(name, opts.run)
        mounts.insert(0, cwd)
    if opts.python:
        argv = procs.python_argv(*argv, python=backend.python(info))
    cmd = tb.command(node, argv, mounts=mounts, cwd=cwd)
    env[DIE_WITH_PARENT] = str(os.getpid())
    proc = subprocess.Popen(cmd, env=env, cwd=cwd)

    def forward(signum, frame):
        try:
            proc.send_signal(signum)
        except ProcessLookupError:
            pass

    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, forward)
    rc = proc.wait()
    return rc if rc >= 0 else 128 - rc


ACROSS_VERSIONS = ("down", "down-all")
"""What a host does for a controller of another version: remove what its own ledger lists."""


def _same_version(controller: str, op: str) -> None:
    """A host upgraded (or downgraded) since ``testbed up`` refuses all but teardown."""
    if controller != __version__ and op not in ACROSS_VERSIONS + ("probe",):  # probe: its own check, at up
        raise StateError(f"this host has testbed {__version__}, the controller {controller}: it changed since "
                         "the testbed came up", "install the same version on every host (`testbed down` works "
                         "meanwhile)")


def _guard(args: list[str]) -> int:
    from testbed.hosts.agentns import hold

    return hold(args[0], on_end=lambda: down(args[0]))


def _serve(args: list[str]) -> int:
    from testbed.engine.hostserve import serve

    die_with_connection(signal.SIGTERM)
    return serve(args[0], SERVED)


def _sftp(args: list[str]) -> int:
    from testbed.hosts.agentns import sftp

    return sftp()


@dataclass(frozen=True)
class Operation:
    args: int
    """How many arguments it takes."""
    run: Callable[[list[str]], "dict | int"]
    """Its answer (printed as one JSON line), or the exit status of one that speaks for itself."""


OPERATIONS: dict[str, Operation] = {
    "probe": Operation(0, lambda a: probe(dict_of(_payload(), "request"))),
    "apply": Operation(1, lambda a: apply(a[0], dict_of(_payload(), "request"))),
    "down": Operation(1, lambda a: down(a[0])),
    "down-all": Operation(0, lambda a: down_all()),
    "counters": Operation(1, lambda a: counters(a[0])),
    "rundir": Operation(2, lambda a: rundir(a[0], a[1])),
    "shape": Operation(1, lambda a: shape(a[0], dict_of(_payload(), "request"))),
    "guard": Operation(1, _guard),  # the controller's own part on its node (slurmjob.guard_here)
    "serve": Operation(1, _serve),  # the long-lived agent: SERVED's requests, one line each way
    "sftp": Operation(0, _sftp),
}
"""``testbed _host OP ARGS`` (besides ``exec``, which relays a command): one request per
SSH session or Slurm step, its payload on stdin."""


def main(op: str, args: list[str]) -> int:
    """Dispatch ``testbed _host [--controller=VERSION] OP ARGS``; prints the JSON answer
    (``exec``: relays the command); the exit status."""
    controller = None
    if op.startswith("--controller=") and args:
        controller, op, args = op.partition("=")[2], args[0], args[1:]
    holding = op == "apply" and args[1:] == ["--hold"]
    plugins.load()  # a share may name a plugin's actions, as the controller's plan made them
    if holding:
        args = args[:1]
    try:
        if op == "exec":
            if len(args) < 4:
                raise TestbedError("usage: testbed _host exec NAME NODE [OPTIONS] -- ARGV...")
            try:
                if controller is not None:
                    _same_version(controller, op)
                return exec_(args[0], args[1], args[2:])
            except TestbedError as e:
                sys.stderr.write(f"error: {e}\n")
                return 1
        if controller is not None:
            _same_version(controller, op)
        found = OPERATIONS.get(op)
        if found is None or len(args) != found.args:
            raise TestbedError(f"unknown operation {op!r} or wrong arguments {args!r}")
        answer = found.run(args)
        if isinstance(answer, int):  # an operation that spoke for itself (serve, sftp, guard)
            return answer
    except TestbedError as e:
        sys.stdout.write(json.dumps(e.to_dict()) + "\n")
        return 1
    sys.stdout.write(json.dumps(answer, default=str) + "\n")
    if holding:  # answered: now stay while the share is up (agentns.hold)
        from testbed.hosts.agentns import hold

        sys.stdout.flush()
        return hold(args[0], on_end=lambda: down(args[0]))  # the job's end removes the share
    return 0
