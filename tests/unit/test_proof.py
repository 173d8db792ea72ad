"""The proof's arithmetic: cuts of a topology, the bytes each collective kind must move across
a cut (per direction), the verdict with its tolerance, and hostile counts files. The rank
side (workloads.collectives) is tested for real in tests/workloads/test_collectives.py, the
whole proof across real links in tests/kernel/test_proof.py."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from testbed.runs.bounds import Bound, Totals, bound, cuts, unbounded
from testbed.runs.proof import TOLERANCE, judge, read_counts


@dataclass
class L:
    index: int
    a: str
    b: str

    @property
    def name(self) -> str:
        return f"{self.a}-{self.b}"


# three_switch: w0-w3 on s1, w4-w7 on s2, s1 and s2 up to s0
THREE = [L(i, f"w{i}", "s1") for i in range(4)] + [L(i, f"w{i}", "s2") for i in range(4, 8)] + \
        [L(8, "s1", "s0"), L(9, "s2", "s0")]
WORKERS = {f"w{i}": i for i in range(8)}


def _cut(name, links=THREE, workers=WORKERS):
    return next(c for c in cuts(workers, links) if c.name == name)


def _totals(groups: dict, ops: dict, sends: dict | None = None) -> Totals:
    """ops: (group, kind) -> {rank: (count, in, out)}"""
    return Totals(groups={k: tuple(v) for k, v in groups.items()},
                  ops={k: {r: list(c) for r, c in v.items()} for k, v in ops.items()}, sends=sends or {})


WORLD = {"0": range(8)}


def test_every_link_of_a_tree_is_a_cut_with_the_ranks_on_each_side():
    c = {x.name: x for x in cuts(WORKERS, THREE)}
    assert len(c) == 10
    assert c["w5-s2"].a == {5} and c["w5-s2"].b == {0, 1, 2, 3, 4, 6, 7}
    assert c["s1-s0"].a == {0, 1, 2, 3} and c["s1-s0"].b == {4, 5, 6, 7}
    assert c["s2-s0"].a == {4, 5, 6, 7}


def test_a_link_on_a_loop_is_no_cut():
    ring = [L(0, "w0", "s0"), L(1, "w1", "s1"), L(2, "s0", "s1"), L(3, "s1", "s2"), L(4, "s2", "s0")]
    names = {c.name for c in cuts({"w0": 0, "w1": 1}, ring)}
    assert names == {"w0-s0", "w1-s1"}  # s0-s1, s1-s2, s2-s0: traffic can go around


def test_all_reduce_moves_its_size_each_way_across_every_cut_it_spans():
    t = _totals(WORLD, {("0", "all_reduce"): {r: (10, 4000, 4000) for r in range(8)}})
    assert bound(_cut("s1-s0"), t) == Bound(4000, 4000, 0)
    assert bound(_cut("w3-s1"), t) == Bound(4000, 4000, 0)
    # a rank that lost recorder entries counted less: the smallest count is the bound (never inflated)
    t.ops[("0", "all_reduce")][6] = [9, 3600, 3600]
    assert bound(_cut("s1-s0"), t) == Bound(3600, 3600, 0)


def test_all_gather_moves_each_sides_pieces_to_the_other():
    t = _totals(WORLD, {("0", "all_gather"): {r: (1, 100 * (r + 1), 800) for r in range(8)}})
    assert bound(_cut("s1-s0"), t) == Bound(100 + 200 + 300 + 400, 500 + 600 + 700 + 800, 0)
    assert bound(_cut("w0-s1"), t) == Bound(100, sum(100 * (r + 1) for r in range(1, 8)), 0)


def test_reduce_scatter_delivers_the_other_sides_pieces():
    t = _totals(WORLD, {("0", "reduce_scatter"): {r: (1, 800, 100) for r in range(8)}})
    assert bound(_cut("s1-s0"), t) == Bound(400, 400, 0)
    assert bound(_cut("w7-s2"), t) == Bound(700, 100, 0)  # w7 sends the others' 7 pieces, receives its own


def test_broadcast_and_reduce_without_a_root_are_a_shared_bound():
    t = _totals(WORLD, {("0", "broadcast"): {r: (2, 50, 50) for r in range(8)},
                        ("0", "reduce"): {r: (1, 30, 30) for r in range(8)}})
    assert bound(_cut("s2-s0"), t) == Bound(0, 0, 80)


def test_sends_cross_exactly_the_cuts_between_sender_and_receiver():
    t = _totals(WORLD, {}, sends={(0, 5): 1000, (5, 0): 10, (0, 1): 7})
    assert bound(_cut("s1-s0"), t) == Bound(1000, 10, 0)  # 0 -> 1 stays under s1
    assert bound(_cut("w0-s1"), t) == Bound(1007, 10, 0)
    assert bound(_cut("w1-s1"), t) == Bound(0, 7, 0)
    assert bound(_cut("w4-s2"), t) == Bound(0, 0, 0)


def test_hierarchical_groups_bound_only_the_links_they_span():
    """PruneX / hier-allreduce: an all-reduce inside each switch, the leaders' all-reduce
    across the core, a broadcast inside each switch; SparDL's teams alike."""
    groups = {"0": range(8), "1": [0, 1, 2, 3], "2": [4, 5, 6, 7], "3": [0, 4]}
    t = _totals(groups, {("1", "all_reduce"): {r: (1, 1000, 1000) for r in range(4)},
                         ("2", "all_reduce"): {r: (1, 1000, 1000) for r in range(4, 8)},
                         ("3", "all_reduce"): {0: (1, 1000, 1000), 4: (1, 1000, 1000)},
                         ("1", "broadcast"): {r: (1, 1000, 1000) for r in range(4)}})
    assert bound(_cut("s1-s0"), t) == Bound(1000, 1000, 0)  # only the leaders cross the core
    assert bound(_cut("w0-s1"), t) == Bound(2000, 2000, 1000)  # leader: its switch and the core
    assert bound(_cut("w1-s1"), t) == Bound(1000, 1000, 1000)
    assert bound(_cut("w5-s2"), t) == Bound(1000, 1000, 0)


def test_sub_groups_and_single_rank_groups():
    t = _totals({"0": range(8), "1": [2], "2": [1, 6]},
                {("1", "all_reduce"): {2: (5, 10**6, 10**6)},  # a group of one moves nothing
                 ("2", "all_gather"): {1: (1, 10, 20), 6: (1, 10, 20)}})
    assert bound(_cut("w2-s1"), t) == Bound(0, 0, 0)
    assert bound(_cut("s1-s0"), t) == Bound(10, 10, 0)
    assert bound(_cut("w3-s1"), t) == Bound(0, 0, 0)


def test_kinds_without_a_bound_are_counted_and_listed():
    t = _totals(WORLD, {("0", "gather"): {r: (3, 10, 10) for r in range(8)},
                        ("0", "all_to_all"): {r: (2, 10, 10) for r in range(8)},
                        ("0", "barrier"): {r: (9, 0, 0) for r in range(8)}})
    assert bound(_cut("s1-s0"), t) == Bound(0, 0, 0)
    assert unbounded(t) == {"gather": 3, "all_to_all": 2}


# --- the verdict, from counts files as the ranks write them --------------------------------

def _write(tmp_path, world=8, ops=None, sends=None, groups=None, **extra):
    for r in range(world):
        doc = {"rank": r, "recorder_entries": 1024, "entries": 10, "uncounted": 0,
               "groups": groups or {"0": list(range(world))},
               "ops": ops(r) if ops else [{"phase": "train", "group": "0", "kind": "all_reduce", "count": 10,
                                           "in_bytes": 40_000, "out_bytes": 40_000}],
               "sends": sends(r) if sends else []}
        doc.update(extra)
        (tmp_path / f"collectives{r}.json").write_text(json.dumps(doc))


def _measured(fwd: int, rev: int, links=THREE) -> dict:
    return {(l.index, d): v for l in links for d, v in (("forward", fwd), ("reverse", rev))}


def test_a_run_passes_when_every_link_carried_its_bound_each_way(tmp_path):
    _write(tmp_path)
    proof = judge(read_counts(tmp_path, 8), cuts(WORKERS, THREE), _measured(80_000, 80_000))
    assert proof["verdict"] == "passed", proof
    row = proof["links"]["s1-s0 forward"]
    assert row["bound_bytes"] == 40_000 and row["measured_bytes"] == 80_000
    assert row["from_ranks"] == [0, 1, 2, 3] and row["to_ranks"] == [4, 5, 6, 7]
    assert proof["collectives"]["train"]["all_reduce"] == {"calls": 80, "bytes": 320_000}


def test_the_tolerance_is_small_and_exact(tmp_path):
    _write(tmp_path)
    just = int(40_000 * (1 - TOLERANCE))
    assert judge(read_counts(tmp_path, 8), cuts(WORKERS, THREE), _measured(just, just))["verdict"] == "passed"
    proof = judge(read_counts(tmp_path, 8), cuts(WORKERS, THREE), _measured(just - 1, 80_000))
    assert proof["verdict"] == "bypassed"
    assert proof["reason"].startswith("link w0-s1 forward carried 39,599 bytes, under the 40,000 bytes"), proof


def test_one_ranks_quiet_link_is_named_while_the_others_pass(tmp_path):
    _write(tmp_path)
    measured = _measured(80_000, 80_000)
    measured[(6, "forward")] = measured[(6, "reverse")] = 1_000  # w6 reached the others some other way
    proof = judge(read_counts(tmp_path, 8), cuts(WORKERS, THREE), measured)
    assert proof["verdict"] == "bypassed"
    assert "link w6-s2 forward carried 1,000 bytes" in proof["reason"] and "from ranks 6 to ranks 0,1,2,3,4,5,7" \
        in proof["reason"], proof["reason"]


def test_a_shared_bound_is_met_by_both_directions_together(tmp_path):
    _write(tmp_path, ops=lambda r: [{"phase": "train", "group": "0", "kind": "broadcast", "count": 1,
                                     "in_bytes": 10_000, "out_bytes": 10_000}])
    ok = judge(read_counts(tmp_path, 8), cuts(WORKERS, THREE), _measured(10_000, 0))
    assert ok["verdict"] == "passed"
    short = judge(read_counts(tmp_path, 8), cuts(WORKERS, THREE), _measured(4_000, 4_000))
    assert short["verdict"] == "bypassed" and "both ways, under the 10,000 bytes" in short["reason"]


def test_no_collective_in_training_is_unproven(tmp_path):
    # DDP's start-up broadcast and the evaluations' all-reduces are "other": not the training's
    _write(tmp_path, ops=lambda r: [
        {"phase": "other", "group": "0", "kind": "broadcast", "count": 3, "in_bytes": 10**6, "out_bytes": 10**6},
        {"phase": "train", "group": "0", "kind": "barrier", "count": 3, "in_bytes": 0, "out_bytes": 0}])
    proof = judge(read_counts(tmp_path, 8), cuts(WORKERS, THREE), _measured(10**7, 10**7))
    assert proof["verdict"] == "unproven" and "issued no collective" in proof["reason"]
    _write(tmp_path, groups={"0": list(range(8)), "1": [3]},  # a group of one: nothing crosses
           ops=lambda r: [{"phase": "train", "group": "1", "kind": "all_reduce", "count": 3, "in_bytes": 9,
                           "out_bytes": 9}])
    assert judge(read_counts(tmp_path, 8), cuts(WORKERS, THREE), _measured(0, 0))["verdict"] == "unproven"


def test_a_bottleneck_no_collective_has_to_cross_proves_nothing(tmp_path):
    """Both workers under one switch, the shaped link leads to an empty one."""
    links = [L(0, "w0", "s0"), L(1, "w1", "s0"), L(2, "s0", "s1")]
    _write(tmp_path, world=2)
    proof = judge(read_counts(tmp_path, 2), cuts({"w0": 0, "w1": 1}, links), _measured(10**6, 10**6, links),
                  {2: "s0-s1"})
    assert proof["verdict"] == "unproven" and "bottleneck link(s) s0-s1" in proof["reason"], proof
    assert proof["links"]["s0-s1 forward"]["bound_bytes"] == 0
    assert judge(read_counts(tmp_path, 2), cuts({"w0": 0, "w1": 1}, links), _measured(10**6, 10**6, links),
                 {0: "w0-s0"})["verdict"] == "passed"


def test_sends_in_training_count_as_collectives(tmp_path):
    _write(tmp_path, ops=lambda r: [], sends=lambda r: [{"phase": "train", "dst": (r + 1) % 8, "count": 4,
                                                          "bytes": 4000}])
    proof = judge(read_counts(tmp_path, 8), cuts(WORKERS, THREE), _measured(5000, 5000))
    assert proof["verdict"] == "passed" and proof["links"]["s1-s0 forward"]["bound_bytes"] == 4000


@pytest.mark.parametrize("damage", [
    None,  # missing
    "not json",
    json.dumps([1, 2]),
    json.dumps({"recorder_entries": 0, "groups": {}, "ops": [], "sends": []}),  # the recorder was off
    json.dumps({"recorder_entries": 9, "groups": {"0": list(range(8))}, "ops": [{"phase": "train"}], "sends": []}),
    json.dumps({"recorder_entries": 9, "groups": {"0": list(range(8))}, "sends": [],
                "ops": [{"phase": "train", "group": "0", "kind": "all_reduce", "count": -1, "in_bytes": 1,
                         "out_bytes": 1}]}),
    json.dumps({"recorder_entries": 9, "groups": {"0": list(range(8))}, "sends": [],
                "ops": [{"phase": "train", "group": "0", "kind": "all_reduce", "count": 1, "in_bytes": 10**30,
                         "out_bytes": 1}]}),
    "[" * 100_000,
])
def test_a_missing_or_damaged_counts_file_makes_the_run_unproven(tmp_path, damage):
    _write(tmp_path)
    f = tmp_path / "collectives3.json"
    f.unlink()
    if damage is not None:
        f.write_text(damage)
    proof = judge(read_counts(tmp_path, 8), cuts(WORKERS, THREE), _measured(10**7, 10**7))
    assert proof["verdict"] == "unproven" and proof["reason"].startswith("rank(s) 3 left no collective counts")


def test_counts_files_that_disagree_about_a_group_are_refused(tmp_path):
    _write(tmp_path)
    doc = json.loads((tmp_path / "collectives5.json").read_text())
    doc["groups"]["0"] = [0, 5]
    (tmp_path / "collectives5.json").write_text(json.dumps(doc))
    from testbed.runs.proof import TrafficUnproven

    with pytest.raises(TrafficUnproven, match="disagree about the members of process group 0"):
        read_counts(tmp_path, 8)
