"""Lower bounds per cut: the bytes any correct algorithm must move across a link, per direction.

On a tree every link is a cut: removing it splits the ranks into the side of its ``a`` end
and the side of its ``b`` end (``forward`` is a->b). For a collective whose group has
members on both sides, a correct algorithm that does not compress the data must move at
least (A: the a-side members, B: the b-side members, per call):

    all_reduce       N bytes each way (each side needs the other side's partial sum)
    all_gather       A->B: the A members' pieces; B->A: the B members' pieces
    reduce_scatter   A->B: the pieces the B members own (their outputs); B->A: the A members'
    broadcast/reduce N bytes in one direction or the other (the recorder does not keep the
                     root): counted as a shared bound, met by the two directions together
    send             exactly its bytes, from the sender's side to the receiver's
    gather, scatter, all_to_all, unknown kinds: counted, not bounded (the root or the splits
                     are not recorded); barrier: no data

A link that is not a cut (a loop through STP switches) gets no bound. Sums over the run are
taken from each rank's totals (workloads.collectives), which is exact because every bound
above is linear in the calls; an all-reduce's N is the smallest any member counted, so a
rank whose recorder lost entries only weakens the bound, never inflates it.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

BOUNDED = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce")
NO_DATA = ("barrier",)


@dataclass(frozen=True)
class Cut:
    """One link and the ranks on either side of it."""

    index: int
    name: str
    a: frozenset[int]
    b: frozenset[int]

    def splits(self, members) -> bool:
        return bool(self.a & set(members)) and bool(self.b & set(members))


@dataclass
class Bound:
    """Bytes that must cross one link: per direction, and shared (either direction)."""

    forward: int = 0
    reverse: int = 0
    shared: int = 0


@dataclass
class Totals:
    """What the ranks counted, merged: per group and kind, each member's in/out bytes."""

    groups: dict[str, tuple[int, ...]] = field(default_factory=dict)
    ops: dict[tuple[str, str], dict[int, list[int]]] = field(default_factory=dict)
    """(group, kind) -> rank -> [count, in_bytes, out_bytes]"""
    sends: dict[tuple[int, int], int] = field(default_factory=dict)
    """(src, dst) -> bytes"""


def cuts(workers: dict[str, int], links) -> list[Cut]:
    """Every link that splits the graph in two, with the ranks on each side. ``workers``:
    node name -> rank; ``links``: objects with ``index``, ``name``, ``a``, ``b``."""
    adj: dict[str, list[tuple[str, int]]] = {}
    for l in links:
        adj.setdefault(l.a, []).append((l.b, l.index))
        adj.setdefault(l.b, []).append((l.a, l.index))
    out = []
    for l in links:
        side = _reach(adj, l.a, without=l.index)
        if l.b in side:
            continue  # a loop: traffic may go around this link
        a = frozenset(r for n, r in workers.items() if n in side)
        out.append(Cut(l.index, l.name, a, frozenset(workers.values()) - a))
    return out


def _reach(adj: dict[str, list[tuple[str, int]]], start: str, without: int) -> set[str]:
    seen, todo = {start}, deque([start])
    while todo:
        for nxt, idx in adj.get(todo.popleft(), []):
            if idx != without and nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def bound(cut: Cut, t: Totals) -> Bound:
    """The bytes the counted collectives must move across ``cut``."""
    out = Bound()
    for (group, kind), per_rank in t.ops.items():
        members = t.groups.get(group, ())
        if kind not in BOUNDED or len(members) < 2 or not cut.splits(members):
            continue
        counted = [per_rank.get(m, [0, 0, 0]) for m in members]
        if kind == "all_reduce":
            n = min(c[1] for c in counted)
            out.forward += n
            out.reverse += n
        elif kind in ("broadcast", "reduce"):
            out.shared += min(c[1] for c in counted)
        elif kind == "all_gather":
            out.forward += sum(per_rank.get(m, [0, 0, 0])[1] for m in members if m in cut.a)
            out.reverse += sum(per_rank.get(m, [0, 0, 0])[1] for m in members if m in cut.b)
        else:  # reduce_scatter: each side must deliver the other side's pieces
            out.forward += sum(per_rank.get(m, [0, 0, 0])[2] for m in members if m in cut.b)
            out.reverse += sum(per_rank.get(m, [0, 0, 0])[2] for m in members if m in cut.a)
    for (src, dst), b in t.sends.items():
        if src in cut.a and dst in cut.b:
            out.forward += b
        elif src in cut.b and dst in cut.a:
            out.reverse += b
    return out


def unbounded(t: Totals) -> dict[str, int]:
    """Calls counted but not bounded, by kind (gather, scatter, all_to_all, unknown)."""
    out: dict[str, int] = {}
    for (group, kind), per_rank in t.ops.items():
        if kind not in BOUNDED and kind not in NO_DATA and len(t.groups.get(group, ())) > 1:
            out[kind] = out.get(kind, 0) + max(c[0] for c in per_rank.values())
    return out
