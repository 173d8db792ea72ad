"""The bound arithmetic on a deeper tree than three_switch: a core switch, two aggregation
switches, edge switches under them (one without workers), ranks spread unevenly, three
levels of cut (a worker's link, an edge uplink, an aggregation uplink), and sub-groups that
lie on one side of a cut, so that their collectives need not cross it. Every expected value
is computed by hand in the comments.

            c0
          /    \\
        a1      a2 ------ w6 (rank 6)
       /  \\     |  \\
     e1    e2   e3   e4 (no workers)
   0 1 2   3    4 5
"""

from __future__ import annotations

import pytest

from testbed.runs.bounds import Bound, bound, cuts
from testbed.runs.proof import judge, read_counts

from .test_proof import L, _totals, _write

TREE = [L(0, "w0", "e1"), L(1, "w1", "e1"), L(2, "w2", "e1"), L(3, "w3", "e2"), L(4, "w4", "e3"),
        L(5, "w5", "e3"), L(6, "w6", "a2"),
        L(7, "e1", "a1"), L(8, "e2", "a1"), L(9, "e3", "a2"), L(10, "e4", "a2"),
        L(11, "a1", "c0"), L(12, "a2", "c0")]
WORKERS = {f"w{r}": r for r in range(7)}
ALL = set(range(7))

# The run's collectives (per rank: calls, in bytes, out bytes):
#   world all-reduce of 1000 B; world all-gather, rank r's piece (r + 1) x 100 B (2800 B in all);
#   group [0, 1, 3] (under a1, across e1 and e2) all-reduce of 5000 B;
#   group [4, 5] (under e3) reduce-scatter, rank 4 owns 300 B of the output, rank 5 400 B;
#   group [2, 6] broadcast of 700 B (root not recorded: a shared bound);
#   rank 3 sends 900 B to rank 6.
GROUPS = {"0": range(7), "1": [0, 1, 3], "2": [4, 5], "3": [2, 6]}
OPS = {("0", "all_reduce"): {r: (10, 1000, 1000) for r in range(7)},
       ("0", "all_gather"): {r: (1, 100 * (r + 1), 2800) for r in range(7)},
       ("1", "all_reduce"): {r: (2, 5000, 5000) for r in (0, 1, 3)},
       ("2", "reduce_scatter"): {4: (1, 700, 300), 5: (1, 700, 400)},
       ("3", "broadcast"): {2: (1, 700, 700), 6: (1, 700, 700)}}
SENDS = {(3, 6): 900}


def _cut(name):
    return next(c for c in cuts(WORKERS, TREE) if c.name == name)


def test_every_level_of_the_tree_is_a_cut_with_the_ranks_on_each_side():
    c = {x.name: x for x in cuts(WORKERS, TREE)}
    assert len(c) == 13
    assert (c["w6-a2"].a, c["e2-a1"].a, c["e1-a1"].a, c["e3-a2"].a) == ({6}, {3}, {0, 1, 2}, {4, 5})
    assert (c["a1-c0"].a, c["a1-c0"].b) == ({0, 1, 2, 3}, {4, 5, 6})  # the core: 4 ranks against 3
    assert (c["a2-c0"].a, c["a2-c0"].b) == ({4, 5, 6}, {0, 1, 2, 3})
    assert (c["e4-a2"].a, c["e4-a2"].b) == (set(), ALL)  # a branch without workers splits no group


@pytest.mark.parametrize("link, want", [
    # core, a1's side {0,1,2,3}: all-reduce 1000 / 1000; all-gather 100+200+300+400 = 1000 /
    # 500+600+700 = 1800; group [0,1,3] stays under a1: 0; group [4,5]: 0; broadcast [2,6]:
    # 700 shared; 3 -> 6: 900 forward
    ("a1-c0", Bound(1000 + 1000 + 900, 1000 + 1800, 700)),
    # the same bytes seen from a2's side: the directions swap
    ("a2-c0", Bound(1000 + 1800, 1000 + 1000 + 900, 700)),
    # e1 uplink, {0,1,2}: all-reduce 1000 / 1000; all-gather 600 / 2200; group [0,1,3]
    # 5000 / 5000; broadcast [2,6] 700 shared; 3 -> 6 does not cross
    ("e1-a1", Bound(1000 + 600 + 5000, 1000 + 2200 + 5000, 700)),
    # e2 uplink, {3}: all-reduce 1000 / 1000; all-gather 400 / 2400; group [0,1,3] 5000 /
    # 5000; broadcast [2,6] not; 3 -> 6 900 forward
    ("e2-a1", Bound(1000 + 400 + 5000 + 900, 1000 + 2400 + 5000, 0)),
    ("w3-e2", Bound(1000 + 400 + 5000 + 900, 1000 + 2400 + 5000, 0)),  # rank 3 alone: the same cut
    # e3 uplink, {4,5}: all-reduce 1000 / 1000; all-gather 1100 / 1700; the reduce-scatter of
    # [4,5] stays under e3: 0; nothing else crosses
    ("e3-a2", Bound(1000 + 1100, 1000 + 1700, 0)),
    # w4's link, {4}: all-reduce 1000 / 1000; all-gather 500 / 2300; reduce-scatter: rank 5's
    # 400 B piece out, rank 4's 300 B piece in
    ("w4-e3", Bound(1000 + 500 + 400, 1000 + 2300 + 300, 0)),
    # w6's link, {6}: all-reduce 1000 / 1000; all-gather 700 / 2100; broadcast 700 shared; 3 -> 6 in
    ("w6-a2", Bound(1000 + 700, 1000 + 2100 + 900, 700)),
    # w0's link, {0}: all-reduce 1000 / 1000; all-gather 100 / 2700; group [0,1,3] 5000 / 5000
    ("w0-e1", Bound(1000 + 100 + 5000, 1000 + 2700 + 5000, 0)),
    ("e4-a2", Bound(0, 0, 0)),  # no rank behind it
])
def test_bounds_on_a_deeper_tree_are_the_hand_computed_ones(link, want):
    assert bound(_cut(link), _totals(GROUPS, OPS, SENDS)) == want


def test_a_sub_group_on_one_side_of_a_cut_adds_nothing_to_it():
    """Only the teams' own collectives: the core and the other aggregation switch's links owe nothing."""
    t = _totals(GROUPS, {k: v for k, v in OPS.items() if k[0] in ("1", "2")})
    for link in ("a1-c0", "a2-c0", "e3-a2", "e4-a2", "w6-a2", "w2-e1"):
        assert bound(_cut(link), t) == Bound(0, 0, 0), link
    assert bound(_cut("e1-a1"), t) == bound(_cut("e2-a1"), t) == Bound(5000, 5000, 0)
    assert bound(_cut("w5-e3"), t) == Bound(300, 400, 0)  # rank 5 sends rank 4's piece, receives its own


def test_the_verdict_on_the_deeper_tree_names_a_core_link_that_fell_short(tmp_path):
    """A team all-reduce under a1 and a world all-reduce: the core owes only the world's bytes."""
    def ops(r):
        out = [{"phase": "train", "group": "0", "kind": "all_reduce", "count": 4, "in_bytes": 8000,
                "out_bytes": 8000}]
        if r in (0, 1, 3):
            out.append({"phase": "train", "group": "1", "kind": "all_reduce", "count": 4, "in_bytes": 40_000,
                        "out_bytes": 40_000})
        return out

    _write(tmp_path, world=7, ops=ops, groups={"0": list(range(7)), "1": [0, 1, 3]})
    measured = {(l.index, d): 100_000 for l in TREE for d in ("forward", "reverse")}
    measured[(11, "forward")] = measured[(11, "reverse")] = 8000  # a1-c0: the world's all-reduce only
    proof = judge(read_counts(tmp_path, 7), cuts(WORKERS, TREE), measured)
    assert proof["verdict"] == "passed", proof["reason"]
    assert proof["links"]["a1-c0 forward"]["bound_bytes"] == 8000
    assert proof["links"]["e1-a1 forward"]["bound_bytes"] == 48_000
    measured[(11, "reverse")] = 7000
    proof = judge(read_counts(tmp_path, 7), cuts(WORKERS, TREE), measured)
    assert proof["verdict"] == "bypassed"
    assert proof["reason"].startswith("link a1-c0 reverse carried 7,000 bytes, under the 8,000 bytes") and \
        "from ranks 4,5,6 to ranks 0,1,2,3" in proof["reason"], proof["reason"]
