"""The hosts of a topology from the Slurm job this process runs in (``testbed up --hosts
slurm``): each host the topology names becomes a node of the job, reached through ``srun``
(:mod:`testbed.hosts.slurm.host`).

The order, documented in ``docs/slurm.md``: the topology's host names (those listed in its
``hosts:``, in that order, then those its ``nodes:`` name in ``host:``, in file order) take
the job's nodes in the order of ``SLURM_JOB_NODELIST`` expanded as ``scontrol show
hostnames`` does (:func:`testbed.common.hostlist.expand`, within its bounds: Slurm's
variables are input, checked by :mod:`testbed.common.slurmenv`). Nodes left over stay
unused. A host that falls on the node this process runs on (a batch script runs on the
job's first node) is this machine, ``local``: its nodes are built here, as the
controller's own; as root a step on this node (:func:`guard_here`) removes them at the
job's end, as the steps holding the other nodes' shares remove theirs.

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

from testbed.common import rootless, slurmenv
from testbed.common.errors import StateError, TopologyError
from testbed.hosts.slurm import step as slurmstep
from testbed.model.hosts import LOCAL_HOST, Host


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
    """:func:`assign` with the job this process runs in (one-line errors outside a job, and
    on a Slurm variable that is not what Slurm sets: :mod:`testbed.common.slurmenv`)."""
    env = os.environ if env is None else env
    try:
        job, nodes, here = slurmenv.job_id(env), slurmenv.job_nodes(env), slurmenv.node_name(env)
    except StateError as e:
        raise StateError(f"--hosts slurm: {e.message}", e.hint) from None
    if job is None or not nodes:
        raise StateError("--hosts slurm: this is not inside a Slurm job (no SLURM_JOB_ID / SLURM_JOB_NODELIST)",
                         "run it inside an allocation: salloc -N 2, then testbed up ...; or in an sbatch script")
    used = nodes[:len(host_names(data))]
    return assign(data, job, nodes, node_addresses(used), here, own_program())


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
    node, job = slurmenv.or_none(slurmenv.node_name, env), slurmenv.or_none(slurmenv.job_id, env)
    if os.geteuid() != 0 or rootless.active() or node is None or job is None:
        return False  # (uid 0 in an ordinary user's rootless namespaces is not root)
    here = Host(name=node, address="127.0.0.1", underlay="127.0.0.1", testbed=own_program(), slurm=node,
                slurm_job=job)
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
        said = " / ".join(r.stderr.strip().splitlines()[-3:])[-300:]  # its last lines, on one line
        raise StateError(f"--hosts slurm: scontrol show node failed: {said}")
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
