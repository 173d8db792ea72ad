"""The machines a topology spans: ``hosts:`` (remote machines reached over SSH, or nodes
of a Slurm job reached through ``srun``) and ``vxlan:`` (the tunnels that carry links
between hosts). The local host is implicit.

A ``hosts:`` entry also travels as JSON (a ledger entry, a relay's argument) and is then
checked by the same rules (:func:`host_from_json`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from testbed.common import slurmenv
from testbed.common.errors import TopologyError, shown
from testbed.model.fields import MAX_NODE_NAME, check_name, ipv4, mapping, unknown_keys

LOCAL_HOST = "local"
"""The machine ``testbed up`` runs on (the controller); nodes without ``host:`` are placed here."""
VXLAN_OVERHEAD = 50  # outer Ethernet 14 + IPv4 20 + UDP 8 + VXLAN 8
DEFAULT_VXLAN_PORT = 4789  # IANA's
MIN_INNER_MTU = 1280
DNS_RE = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$")
USER_RE = re.compile(r"^[a-z_][a-z0-9_.-]{0,31}$")
PROGRAM_RE = re.compile(r"^[A-Za-z0-9_./+-]{1,255}$")

SLURM_NODE_RE = slurmenv.NODE_RE

HOST_KEYS = ("name", "address", "user", "port", "key", "known_hosts", "accept_new_host_key", "underlay", "testbed",
             "slurm", "slurm_job")
SSH_ONLY_KEYS = ("user", "port", "key", "known_hosts", "accept_new_host_key")
"""What only a host reached over SSH takes (a Slurm node is reached through ``srun``)."""
VXLAN_KEYS = ("port", "mtu")
TUNNEL_KEYS = ("port",)


@dataclass(frozen=True)
class Host:
    """A machine that runs its share of the testbed (``hosts:``): reached over SSH, or (with
    ``slurm``) a node of a Slurm job reached through ``srun`` (:mod:`testbed.hosts.slurm.host`)."""

    name: str
    address: str
    """Where SSH connects (an IP address or a DNS name)."""
    underlay: str
    """This host's IPv4 address for VXLAN tunnels (default: ``address`` when that is one)."""
    user: str = "root"
    port: int = 22
    key: str | None = None
    """Private key file; None: the SSH agent and the default keys (~/.ssh/id_*)."""
    known_hosts: str | None = None
    """Where its host key is checked; None: ~/.ssh/known_hosts (then /etc/ssh/ssh_known_hosts)."""
    accept_new_host_key: bool = False
    """Trust a host key seen for the first time and add it to ``known_hosts`` (OpenSSH's
    accept-new). A key that *changed* is refused whatever this says."""
    testbed: str = "testbed"
    """The testbed program on that host (same version as here)."""
    slurm: str | None = None
    """The Slurm node this host is (``SLURMD_NODENAME`` there); None: reached over SSH."""
    slurm_job: int | None = None
    """The job whose steps reach it; None: the job this process runs in (``SLURM_JOB_ID``)."""

    @property
    def kind(self) -> str:
        """How it is reached: ``ssh`` or ``slurm`` (:mod:`testbed.hosts.kinds` by this name)."""
        return "ssh" if self.slurm is None else "slurm"

    def to_dict(self) -> dict:
        d: dict[str, Any] = {"name": self.name, "address": self.address, "underlay": self.underlay}
        if self.slurm is not None:
            d["slurm"] = self.slurm
            if self.slurm_job is not None:
                d["slurm_job"] = self.slurm_job
            d["testbed"] = self.testbed
            return d
        d.update(user=self.user, port=self.port)
        for k in ("key", "known_hosts"):
            if getattr(self, k) is not None:
                d[k] = getattr(self, k)
        if self.accept_new_host_key:
            d["accept_new_host_key"] = True
        d["testbed"] = self.testbed
        return d


def parse_hosts(value: Any) -> tuple[Host, ...]:
    """The ``hosts:`` list: each entry valid, names and tunnel addresses distinct."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise TopologyError("hosts", "must be a list of hosts",
                            "write e.g. hosts: [{name: gpu1, address: 192.0.2.11}]")
    out: list[Host] = []
    seen: set[str] = set()
    for i, item in enumerate(value):
        path = f"hosts[{i}]"
        d = _host_mapping(item, path)
        name = _new_host_name(d["name"], f"{path}.name", seen)
        out.append(_host(d, name, path))
    _check_distinct_underlays(out)
    return tuple(out)


def host_from_json(text: str) -> Host:
    """A ``hosts:`` entry passed as JSON (a ledger entry, a relay's argument), checked by
    the topology's own rules; TopologyError otherwise."""
    try:
        data = json.loads(text)
    except (TypeError, ValueError) as e:
        raise TopologyError("hosts[0]", f"not JSON: {e}") from None
    return parse_hosts([data])[0]


def _host_mapping(item: Any, path: str) -> dict:
    d = mapping(item, path, "name, address, user, port, key, ...")
    unknown_keys(d, HOST_KEYS, path)
    for req in ("name", "address"):
        if req not in d:
            raise TopologyError(f"{path}.{req}", "missing", "every host needs name: and address:")
    return d


def _new_host_name(value: Any, path: str, seen: set[str]) -> str:
    """A valid host name, not the local host's, not taken by an earlier entry (added to ``seen``)."""
    name = check_name(value, path, MAX_NODE_NAME, "host name")
    if name == LOCAL_HOST:
        raise TopologyError(path, f"'{LOCAL_HOST}' is the machine testbed runs on; it needs no entry",
                            "choose another name")
    if name in seen:
        raise TopologyError(path, f"host '{name}' is defined twice")
    seen.add(name)
    return name


def _host(d: dict, name: str, path: str) -> Host:
    """One entry's fields after its name, checked in the order they are listed."""
    address, underlay = _address_and_underlay(d, path)
    if "slurm" in d or "slurm_job" in d:
        return _slurm_host(d, name, path, address, underlay)
    user = d.get("user", "root")
    if not isinstance(user, str) or not USER_RE.fullmatch(user):
        raise TopologyError(f"{path}.user", f"invalid user name {user!r}", "e.g. user: root")
    port = d.get("port", 22)
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise TopologyError(f"{path}.port", f"port must be 1..65535, got {port!r}")
    key, known_hosts = (_file_path(d, k, path) for k in ("key", "known_hosts"))
    accept = d.get("accept_new_host_key", False)
    if not isinstance(accept, bool):
        raise TopologyError(f"{path}.accept_new_host_key", f"must be true or false, got {accept!r}")
    program = d.get("testbed", "testbed")
    if not isinstance(program, str) or not PROGRAM_RE.fullmatch(program):
        raise TopologyError(f"{path}.testbed", f"invalid program path {program!r}",
                            "give the testbed program's path on that host, e.g. /opt/testbed/.venv/bin/testbed")
    return Host(name, address, underlay, user, port, key, known_hosts, accept, program)


def _slurm_host(d: dict, name: str, path: str, address: str, underlay: str) -> Host:
    """An entry that is a node of a Slurm job: its node name, its job, the testbed program there."""
    node, job = d.get("slurm"), d.get("slurm_job")
    if not isinstance(node, str) or not SLURM_NODE_RE.fullmatch(node):
        raise TopologyError(f"{path}.slurm", f"invalid Slurm node name {node!r}" if node is not None else "missing",
                            "the node's name as Slurm knows it (scontrol show hostnames), e.g. slurm: gpu17")
    if job is not None and (isinstance(job, bool) or not isinstance(job, int) or not 1 <= job <= slurmenv.MAX_JOB_ID):
        raise TopologyError(f"{path}.slurm_job", f"a Slurm job id is an integer from 1 to {slurmenv.MAX_JOB_ID}, "
                            f"got {shown(job)}")
    ssh = [k for k in SSH_ONLY_KEYS if k in d]
    if ssh:
        raise TopologyError(f"{path}.{ssh[0]}", f"{ssh[0]} is an SSH setting; a Slurm node is reached through srun",
                            "remove it, or remove slurm: to reach the host over SSH")
    program = d.get("testbed", "testbed")
    if not isinstance(program, str) or not PROGRAM_RE.fullmatch(program):
        raise TopologyError(f"{path}.testbed", f"invalid program path {program!r}",
                            "give the testbed program's path on that node, e.g. /opt/testbed/.venv/bin/testbed")
    return Host(name, address, underlay, testbed=program, slurm=node, slurm_job=job)


def _address_and_underlay(d: dict, path: str) -> tuple[str, str]:
    """Where SSH connects, and the IPv4 address tunnels use (the address when it is one)."""
    address = d["address"]
    ip = ipv4(address)
    if ip is None and not (isinstance(address, str) and DNS_RE.fullmatch(address)):
        raise TopologyError(f"{path}.address", f"{address!r} is neither an IPv4 address nor a host name",
                            "write e.g. address: 192.0.2.11 or address: gpu1.example.org")
    underlay = d.get("underlay", ip)
    if ipv4(underlay) is None:
        raise TopologyError(f"{path}.underlay", f"{underlay!r} is not an IPv4 address" if underlay is not None
                            else "missing: the address is a name, and tunnels need this host's IPv4 address",
                            "write underlay: the address other hosts reach this one at, e.g. 192.0.2.11")
    return address, str(underlay)


def _file_path(d: dict, k: str, path: str) -> str | None:
    v = d.get(k)
    if v is not None and (not isinstance(v, str) or not v or "\0" in v):
        raise TopologyError(f"{path}.{k}", f"{k} must be a file path, got {v!r}")
    return v


def _check_distinct_underlays(hosts: list[Host]) -> None:
    underlays: dict[str, str] = {}
    for h in hosts:
        if h.underlay in underlays:
            raise TopologyError("hosts", f"hosts {underlays[h.underlay]} and {h.name} have the same underlay {h.underlay}",
                                "each host needs its own tunnel address")
        underlays[h.underlay] = h.name


def parse_tunnel(value: Any) -> int | None:
    """``tunnel:`` -> the first UDP port of the testbed's tunnel links, or None (derived from
    the testbed's name and the user's uid when it comes up)."""
    if value is None:
        return None
    d = mapping(value, "tunnel", "port")
    unknown_keys(d, TUNNEL_KEYS, "tunnel")
    port = d.get("port")
    if isinstance(port, bool) or not isinstance(port, int) or not 1024 <= port <= 65535:
        raise TopologyError("tunnel.port", f"port must be 1024..65535, got {port!r}",
                            "tunnel link i uses port + i on both its hosts; leave tunnel: out to derive it")
    return port


def parse_vxlan(value: Any) -> tuple[int, int | None]:
    """``vxlan:`` -> (UDP port, data-plane MTU or None for the default)."""
    if value is None:
        return DEFAULT_VXLAN_PORT, None
    d = mapping(value, "vxlan", "port, mtu")
    unknown_keys(d, VXLAN_KEYS, "vxlan")
    port = d.get("port", DEFAULT_VXLAN_PORT)
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise TopologyError("vxlan.port", f"port must be 1..65535, got {port!r}", f"the default is {DEFAULT_VXLAN_PORT}")
    mtu = d.get("mtu")
    if mtu is not None and (isinstance(mtu, bool) or not isinstance(mtu, int) or not MIN_INNER_MTU <= mtu <= 9000):
        raise TopologyError("vxlan.mtu", f"mtu must be {MIN_INNER_MTU}..9000, got {mtu!r}",
                            f"the underlay's MTU minus {VXLAN_OVERHEAD} (VXLAN's overhead), e.g. 1450 for 1500")
    return port, mtu
