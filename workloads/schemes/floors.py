"""The fewest bytes each built-in scheme's hook hands to collectives for one DDP bucket.

testbed's proof checks, per rank and iteration, that the training's collectives carried at
least the sum of these floors over the buckets DDP handed the hook (``workloads.volume``),
and that DDP handed it every gradient. Each floor is read off the scheme's own code and
rounds down wherever the scheme may send more (control messages, scales, a dense phase
before a compact one): an honest run always meets it, a hook that returns without
communicating (or communicates a token) does not.

    fp16            2 bytes a gradient element (the half-precision all-reduce)
    topk            k values + k int32 positions, k = max(1, ceil(ratio x n)): 8k bytes (all-gather)
    gtopk           8k bytes a round of recursive doubling, log2(m) rounds (m: the largest power
                    of two <= P); a rank folded in beyond m sends its 8k once
    powersgd        per gradient matrix (rows x cols, rank r = min(rows, cols, rank)): the smaller
                    of the matrix and its P and Q factors, (rows + cols) x r elements; the
                    vanilla all-reduce before ``start_powerSGD_iter`` is larger
    terngrad        1 byte a gradient element (the int8 sum; the 4-byte scales not counted)
    pactrain        the bucket's kept entries (its masks): 1 byte each with ternary, else the
                    element size (the dense masked all-reduce before compaction is larger)
    spardl          team of p ranks, d teams, k = max(1, int(ceil(n / p) x density)): p - 1
                    blocks of k entries in the reduce-scatter and p - 1 in the team's all-gather,
                    8 bytes an entry, plus h >= max(1, k // d) entries to each other team
    prunex,         a rank in a domain of several: its domain's dense all-reduce (n elements);
    hier-allreduce  a leader alone in its domain: the leaders' all-reduce of its kept entries

``allreduce`` registers no hook: DDP's reducer all-reduces every gradient, the floor of an
iteration is the dense bytes (``workloads.volume``). A scheme not listed here (``hook``,
one registered from outside) has no floor: its volume is recorded, not checked.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from .spardl import geometry


def _n(bucket) -> int:
    return bucket.buffer().numel()


def fp16(state, bucket) -> int:
    return 2 * _n(bucket)


def topk(state, bucket) -> int:
    return 8 * max(1, math.ceil(state.ratio * _n(bucket)))


def powersgd(state, bucket) -> int:
    rank = state.inner.matrix_approximation_rank
    total = 0
    for p in bucket.parameters():
        rows = p.shape[0] if p.dim() else 1
        cols = p.numel() // max(1, rows)
        total += min(rows * cols, (rows + cols) * min(rows, cols, rank))
    return total * bucket.buffer().element_size()


def gtopk(state, bucket) -> int:
    if state.world == 1:
        return 0
    rounds = state.power.bit_length() - 1 if state.rank < state.power else 1  # a folded rank sends once
    return 8 * max(1, math.ceil(state.ratio * _n(bucket))) * rounds


def terngrad(state, bucket) -> int:
    return _n(bucket)


_KEPT: dict[tuple, int] = {}
"""(id(state), id(its masks), the bucket's parameters) -> kept entries (masks change only by
``PacTrainState.reset``, which replaces them)."""


def pactrain(state, bucket) -> int:
    params = tuple(bucket.parameters())
    key = (id(state), id(state.masks), tuple(map(id, params)))
    kept = _KEPT.get(key)
    if kept is None:
        kept = _KEPT[key] = sum(int(state.masks[id(p)].sum()) if id(p) in state.masks else p.numel()
                                for p in params)
    return kept * (1 if state.config.ternary else bucket.buffer().element_size())


def spardl(state, bucket) -> int:
    if state.world == 1:
        return 0
    p, d = len(state.team), len(state.teams)
    _, k = geometry(_n(bucket), p, state.density)
    return 8 * (2 * (p - 1) * k + (d - 1) * max(1, k // d))  # h >= k // d (next_h), and >= 1


def hierarchical(state, bucket) -> int:
    buf = bucket.buffer()
    if state.intra is not None:
        return buf.numel() * buf.element_size()
    if state.domains > 1 and state.leaders is not None:
        kept = state.positions(bucket)
        return (buf.numel() if kept is None else kept.numel()) * buf.element_size()
    return 0


FLOORS: dict[str, Callable[[object, object], int]] = {
    "fp16": fp16, "topk": topk, "gtopk": gtopk, "powersgd": powersgd, "terngrad": terngrad, "pactrain": pactrain,
    "spardl": spardl, "prunex": hierarchical, "hier-allreduce": hierarchical,
}
"""Scheme name -> floor(state, bucket): bytes its hook hands to collectives for the bucket."""
DENSE = ("allreduce",)
"""Schemes with no hook: DDP's reducer all-reduces every gradient, all of its bytes."""
