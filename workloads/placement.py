"""Where each rank sits: the domains (switches, or machines) that ranks share.

Hierarchical schemes (``prunex``, ``hier-allreduce``) and SparDL's teams need to know
which ranks share fast links. The launcher says it with torchrun's own variables, read
here the same way under both launchers:

* ``testbed run``: a domain is the switch a worker hangs off. ``TESTBED_SWITCH_INDEX``
  is the index of that switch, ``TESTBED_SWITCH_RANK`` / ``TESTBED_SWITCH_SIZE`` the
  rank's place in and the size of its domain; ``TESTBED_SWITCH`` and ``TESTBED_HOST``
  name them and ``TESTBED_PLACEMENT`` is the run's placement.json (every rank's node and
  switch). torchrun's own variables say that each worker is a node of one process with
  one GPU (``LOCAL_RANK`` 0), as ``torch.cuda.set_device(LOCAL_RANK)`` needs.
* plain ``torchrun``: a domain is a machine (``GROUP_RANK`` = torchrun's node rank).
* neither (a single process, or a launcher without ``GROUP_RANK``): one domain.

Every rank contributes its (GROUP_RANK, LOCAL_RANK, names) in one all-gather, so all
ranks build the same groups, and a launcher whose variables disagree (two ranks with
one local rank, a LOCAL_WORLD_SIZE that is not the domain's size) is an error here,
not a silent wrong hierarchy.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

SWITCH_VARS = ("TESTBED_SWITCH_INDEX", "TESTBED_SWITCH_RANK", "TESTBED_SWITCH_SIZE")
"""testbed run's: the switch's index, the rank's place in its group, the group's size."""
TORCHRUN_VARS = ("GROUP_RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
"""torchrun's: the machine's index, the rank's place on it, the ranks on it."""
MAX_NAME = 64
"""Longest switch or host name accepted from the environment (bytes)."""
_SLOT = 256


class PlacementError(ValueError):
    pass


@dataclass(frozen=True)
class Placement:
    rank: int
    groups: tuple[tuple[int, ...], ...]
    """Ranks of each domain, domains in GROUP_RANK order, ranks in LOCAL_RANK order."""
    names: tuple[str, ...]
    """A name per domain (the switch under testbed, else ``node<GROUP_RANK>``)."""
    hosts: tuple[str, ...]
    """The host of each domain's first rank (``local`` when not told)."""

    @property
    def group_index(self) -> int:
        return next(i for i, g in enumerate(self.groups) if self.rank in g)

    @property
    def members(self) -> tuple[int, ...]:
        return self.groups[self.group_index]

    @property
    def local_rank(self) -> int:
        return self.members.index(self.rank)

    @property
    def leaders(self) -> tuple[int, ...]:
        """The first rank of each domain."""
        return tuple(g[0] for g in self.groups)

    @property
    def equal(self) -> bool:
        """All domains have the same size."""
        return len({len(g) for g in self.groups}) == 1

    def to_dict(self) -> dict:
        return {"groups": [list(g) for g in self.groups], "names": list(self.names), "hosts": list(self.hosts)}


def single(world: int, rank: int = 0) -> Placement:
    return Placement(rank, (tuple(range(world)),), ("node0",), ("local",))


def _int_env(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise PlacementError(f"{name}={value!r} is not an integer") from None


def discover(group=None) -> Placement:
    """The placement of every rank of the default group (one all-gather of small tuples)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    names = next((n for n in (SWITCH_VARS, TORCHRUN_VARS) if n[0] in os.environ), None)
    if names is None:  # no launcher said: one domain
        seat = (0, rank, world)
    else:
        seat = (_int_env(names[0], 0), _int_env(names[1], 0), _int_env(names[2], world))
    mine = (*seat, os.environ.get("TESTBED_SWITCH") or "", os.environ.get("TESTBED_HOST") or "local")
    for what, name in ((mine[3], "TESTBED_SWITCH"), (mine[4], "TESTBED_HOST")):
        if len(what.encode()) > MAX_NAME:
            raise PlacementError(f"{name} is longer than {MAX_NAME} bytes")
    # JSON in a fixed-size byte tensor, not all_gather_object: nothing a peer sends is unpickled
    raw = json.dumps(mine).encode()
    mine_t = torch.zeros(_SLOT, dtype=torch.uint8)
    mine_t[:len(raw)] = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
    backend = dist.get_backend(group)
    if backend == "nccl":
        mine_t = mine_t.cuda()
    slots = [torch.zeros_like(mine_t) for _ in range(world)]
    dist.all_gather(slots, mine_t, group=group)
    return build(rank, [_decode(bytes(t.cpu().tolist()), r) for r, t in enumerate(slots)])


def _decode(raw: bytes, rank: int) -> tuple[int, int, int, str, str]:
    try:
        g, local, size, switch, host = json.loads(raw.rstrip(b"\0").decode())
        assert all(type(x) is int for x in (g, local, size)) and all(type(x) is str for x in (switch, host))
    except (ValueError, TypeError, AssertionError):
        raise PlacementError(f"rank {rank} sent an unreadable placement") from None
    return g, local, size, switch, host


def build(rank: int, seen: list[tuple[int, int, int, str, str]]) -> Placement:
    """Groups from every rank's (GROUP_RANK, LOCAL_RANK, LOCAL_WORLD_SIZE, switch, host)."""
    domains: dict[int, list[tuple[int, int]]] = {}
    names: dict[int, str] = {}
    hosts: dict[int, str] = {}
    for r, (g, local, _, switch, host) in enumerate(seen):
        domains.setdefault(g, []).append((local, r))
        names.setdefault(g, switch or f"node{g}")
        hosts.setdefault(g, host)
        if names[g] != (switch or f"node{g}"):
            raise PlacementError(f"ranks with GROUP_RANK {g} name different switches ({names[g]!r}, {switch!r})")
    groups = []
    for g in sorted(domains):
        members = sorted(domains[g])
        locals_ = [x for x, _ in members]
        if locals_ != list(range(len(members))):
            raise PlacementError(f"domain {names[g]!r} (GROUP_RANK {g}) has ranks "
                                 f"{[r for _, r in members]} with LOCAL_RANKs {locals_}; expected 0..{len(members) - 1}")
        for _, r in members:
            if seen[r][2] != len(members):
                raise PlacementError(f"rank {r} says LOCAL_WORLD_SIZE={seen[r][2]} but {len(members)} ranks "
                                     f"have GROUP_RANK {g}")
        groups.append(tuple(r for _, r in members))
    order = sorted(domains)
    return Placement(rank, tuple(groups), tuple(names[g] for g in order), tuple(hosts[g] for g in order))
