"""The hosts of a topology from the Slurm job this process runs in (``testbed up --hosts
slurm``): each host the topology names becomes a node of the job, reached through ``srun``
(:mod:`testbed.hosts.slurm`).

The order, documented in ``docs/slurm.md``: the topology's host names (those listed in its
``hosts:``, in that order, then those its ``nodes:`` name in ``host:``, in file order) take
the job's nodes in the order of ``SLURM_JOB_NODELIST`` expanded as ``scontrol show
hostnames`` does (:func:`expand_hostlist`). Nodes left over stay unused. A host that falls
on the node this process runs on (a batch script runs on the job's first node) is this
machine, ``local``: its nodes are built here, as the controller's own; as root a step on this
node (:func:`guard_here`) removes them at the job's end, as the steps holding the other
nodes' shares remove theirs.

Each node's tunnel address is its ``NodeAddr`` (``scontrol show node``), resolved to IPv4.
"""

from __future__ import annotations

import ipaddress
import os
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, Mapping

from testbed.common.errors import StateError, TopologyError
from testbed.hosts import slurmstep
from testbed.model.hosts import LOCAL_HOST, SLURM_NODE_RE, Host

MAX_NODES = 65536
_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def expand_hostlist(text: str) -> list[str]:
    """Slurm's hostlist syntax (``n[1-3,5],m7``, ``r[1-2]-n[01-02]``) -> node names in
    order (zero padding kept, each bracket group multiplied out left to right); ValueError
    on a malformed list."""
    out: list[str] = []
    for item in _split_top(text.strip()):
        if not item:
            raise ValueError(f"empty name in {text!r}")
        names = [""]
        for literal, group in re.findall(r"([^\[\]]*)(?:\[([^\[\]]*)\])?", item):
            names = [n + literal for n in names]
            if group:
                names = [n + s for n in names for s in _expand_group(group, text)]
            if len(names) > MAX_NODES:
                raise ValueError(f"{text!r} names more than {MAX_NODES} nodes")
        out += names
        if len(out) > MAX_NODES:
            raise ValueError(f"{text!r} names more than {MAX_NODES} nodes")
    for n in out:
        if not SLURM_NODE_RE.fullmatch(n):
            raise ValueError(f"{n!r} is not a node name")
    return out


def _split_top(text: str) -> list[str]:
    """Split at commas outside brackets."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        depth += {"[": 1, "]": -1}.get(ch, 0)
        if depth < 0 or depth > 1:
            raise ValueError(f"unbalanced brackets in {text!r}")
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if depth:
        raise ValueError(f"unbalanced brackets in {text!r}")
    return parts + [cur]


def _expand_group(group: str, text: str) -> list[str]:
    out: list[str] = []
    for r in group.split(","):
        m = _RANGE.fullmatch(r.strip())
        if m is None:
            raise ValueError(f"bad range {r!r} in {text!r}")
        lo, hi = m.group(1), m.group(2) or m.group(1)
        if int(hi) < int(lo) or int(hi) - int(lo) >= MAX_NODES:
            raise ValueError(f"bad range {r!r} in {text!r}")
        out += [str(i).zfill(len(lo)) for i in range(int(lo), int(hi) + 1)]
    return out


def host_names(data: Mapping[str, Any]) -> list[str]:
    """The topology's host names in the documented order: ``hosts:`` entries, then ``host:``
    of the nodes, in file order (``local`` and repeats left out)."""
    names: list[str] = []
    listed = data.get("hosts")
    for h in listed if isinstance(listed, list) else []:
        if isinstance(h, Mapping) and isinstance(h.get("name"), str):
            names.append(h["name"])
    nodes = data.get("nodes")
    for spec in nodes.values() if isinstance(nodes, Mapping) else []:
        host = spec.get("host") if isinstance(spec, Mapping) else None
        if isinstance(host, str):
            names.append(host)
    return [n for i, n in enumerate(names) if n != LOCAL_HOST and n not in names[:i]]


def assign(data: Mapping[str, Any], job: int, nodes: list[str], addresses: Mapping[str, str],
           here: str | None, program: str) -> dict:
    """The topology (a parsed YAML mapping) with its hosts made the job's ``nodes``; a host
    on ``here`` (this process's node) becomes ``local``. Pure: the caller asked Slurm."""
    names = host_names(data)
    if not names:
        raise TopologyError("hosts", "--hosts slurm: the topology places no node on another host",
                            "give nodes host: NAMES (e.g. host: h1 on a switch); each name becomes a node of the job")
    if len(names) > len(nodes):
        raise StateError(f"the topology needs {len(names)} hosts ({', '.join(names)}), but Slurm job {job} has "
                         f"{len(nodes)} node(s) ({', '.join(nodes[:8])})",
                         f"allocate at least {len(names)} nodes (salloc -N {len(names)} / #SBATCH -N {len(names)})")
    mapping = dict(zip(names, nodes))
    entries = [{"name": name, "address": addresses[node], "slurm": node, "slurm_job": job, "testbed": program}
               for name, node in mapping.items() if node != here]
    out = {k: v for k, v in data.items() if k != "hosts"}
    if entries:
        out["hosts"] = entries
    local = {name for name, node in mapping.items() if node == here}
    if local and isinstance(data.get("nodes"), Mapping):
        out["nodes"] = {n: ({**spec, "host": LOCAL_HOST} if isinstance(spec, Mapping) and spec.get("host") in local
                            else spec) for n, spec in data["nodes"].items()}
    return out


def from_job(data: Mapping[str, Any], env: Mapping[str, str] | None = None) -> dict:
    """:func:`assign` with the job this process runs in (one-line errors outside a job)."""
    env = os.environ if env is None else env
    job, nodelist = env.get("SLURM_JOB_ID", ""), env.get("SLURM_JOB_NODELIST", "")
    if not job or not nodelist:
        raise StateError("--hosts slurm: this is not inside a Slurm job (no SLURM_JOB_ID / SLURM_JOB_NODELIST)",
                         "run it inside an allocation: salloc -N 2, then testbed up ...; or in an sbatch script")
    if not job.isdigit() or int(job) < 1:
        raise StateError(f"--hosts slurm: SLURM_JOB_ID={job[:40]!r} is not a job id")
    try:
        nodes = expand_hostlist(nodelist)
    except ValueError as e:
        raise StateError(f"--hosts slurm: SLURM_JOB_NODELIST: {e}") from None
    used = nodes[:len(host_names(data))]
    return assign(data, int(job), nodes, node_addresses(used), env.get("SLURMD_NODENAME"), own_program())


def assign_hosts(data: Any) -> Any:
    """``--hosts slurm`` (:mod:`testbed.hosts.sources`): the topology document with its hosts
    the nodes of this job (:func:`from_job`); a document that is no mapping is left for the
    loader to refuse."""
    return from_job(data) if isinstance(data, dict) else data


def after_up(name: str, topology) -> None:
    """``--hosts slurm`` once testbed ``name`` is up: when part of it is on this node, the
    step that removes that part at the job's end (:func:`guard_here`)."""
    if any(n.host == LOCAL_HOST for n in topology.nodes):
        guard_here(name)


def guard_here(name: str, env: Mapping[str, str] | None = None) -> bool:
    """As root, on a node of the job this process runs in (a batch script on the job's first
    node): start a step on this node that removes testbed ``name``'s part here when the job
    ends (``testbed _host guard NAME``: on the SIGTERM Slurm sends every step at ``scancel``
    or the time limit, what ``testbed down NAME`` does here), as the step that holds each other
    node's share removes that share. It ends by itself once ``down`` removed the testbed. An
    ordinary user's part here lives in their holder, which the job's end ends anyway: False,
    nothing started; so outside a job's node."""
    env = os.environ if env is None else env
    node, job = env.get("SLURMD_NODENAME", ""), env.get("SLURM_JOB_ID", "")
    if os.geteuid() != 0 or not SLURM_NODE_RE.fullmatch(node) or not job.isdigit():
        return False
    here = Host(name=node, address="127.0.0.1", underlay="127.0.0.1", testbed=own_program(), slurm=node,
                slurm_job=int(job))
    argv = slurmstep.host_argv(here, "guard", name)
    if env.get("TESTBED_STATE_DIR"):  # the step works in this process's state directory
        argv = [f"{a},TESTBED_STATE_DIR" if a.startswith("--export=") else a for a in argv]
    slurmstep.start(argv, detach=True, stdin=subprocess.DEVNULL)
    return True


def own_program() -> str:
    """This testbed's program, as the nodes run it: the same path (clusters share the
    software's filesystem), else ``testbed`` from their PATH."""
    exe = Path(sys.executable).parent / "testbed"
    return str(exe) if exe.is_file() and os.access(exe, os.X_OK) else "testbed"


def node_addresses(nodes: list[str]) -> dict[str, str]:
    """Each node's IPv4 address: its ``NodeAddr`` as ``scontrol show node`` gives it, resolved."""
    if not nodes:
        return {}
    try:
        r = subprocess.run(["scontrol", "show", "node", "--oneliner", ",".join(nodes)], capture_output=True,
                           text=True, timeout=60, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise StateError("--hosts slurm: scontrol is not installed here", "install Slurm's client commands") from None
    except subprocess.TimeoutExpired:
        raise StateError("--hosts slurm: scontrol show node gave no answer within 60 s") from None
    if r.returncode != 0:
        raise StateError(f"--hosts slurm: scontrol show node failed: {r.stderr.strip()[-300:]}")
    addrs = {m.group(1): m.group(2) for m in re.finditer(r"NodeName=(\S+)\s.*?NodeAddr=(\S+)", r.stdout)}
    return {n: _ipv4(n, addrs.get(n, n)) for n in nodes}


def _ipv4(node: str, addr: str) -> str:
    try:
        return str(ipaddress.IPv4Address(addr))
    except ValueError:
        pass
    try:
        return str(socket.getaddrinfo(addr, None, socket.AF_INET, socket.SOCK_STREAM)[0][4][0])
    except (OSError, IndexError):
        raise StateError(f"--hosts slurm: node {node}'s address {addr!r} does not resolve to IPv4",
                         "the tunnels between nodes need each node's IPv4 address") from None
