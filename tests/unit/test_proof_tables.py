"""docs/results/proof.md's tables (benchmarks.proof_tables) from constructed records of
benchmarks.proof_overhead; the page itself is checked by test_regenerate."""

from __future__ import annotations

import pytest

from benchmarks import archive, proof_overhead, proof_tables
from testbed.common.errors import TestbedError

# (op, clock): per round, (on, off, default) in µs
CALLS = {("all_reduce", "wall"): [(300, 260, 280), (320, 250, 300)],
         ("all_reduce", "thread"): [(28, 22, 27), (30, 22, 27)],
         ("isend", "wall"): [(200, 100, 150), (200, 100, 150)],
         ("isend", "thread"): [(35, 25, 30), (37, 25, 30)]}


def _rows() -> list[dict]:
    calls = [{"kind": "call", "op": op, "clock": clock, "round": i, "on": on, "off": off, "default": dflt}
             for (op, clock), rounds in CALLS.items() for i, (on, off, dflt) in enumerate(rounds)]
    on = {"recorded_per_iter": 1.0, "isends_per_iter": 0.0, "entries": 41, "uncounted": 0}
    train = [{"kind": "train", "scheme": "allreduce", "pair": p, "on": True, "iter_s": t, **on}
             for p, t in ((0, 0.110), (1, 0.095))]
    train += [{"kind": "train", "scheme": "allreduce", "pair": p, "on": False, "iter_s": 0.100} for p in (0, 1)]
    return train + calls


def _archived(tmp_path, rows):
    archive.record(tmp_path / "po", "proof_overhead", rows, ranks=4, max_iters=40, skip=2, together=True,
                   micro_calls=500, micro_rounds=2, recorded={"on": 2000, "off": 0, "default": 2000},
                   isends_counted=1000)
    return archive.write([tmp_path / "po"], "proof-test", records=tmp_path / "records")


def test_the_per_call_table_gives_medians_and_on_minus_off_per_round():
    assert proof_tables.call_markdown(_rows()) == (
        "| call | clock | off µs | default µs | on µs | added µs (on - off): median [min-max] | on - default µs |\n"
        "| --- | --- | ---: | ---: | ---: | --- | ---: |\n"
        "| all_reduce of 1 float | wall | 255.0 | 290.0 | 310.0 | +55.0 [+40.0 to +70.0] | +20.0 |\n"
        "|  | thread | 22.0 | 27.0 | 29.0 | +7.0 [+6.0 to +8.0] | +2.0 |\n"
        "| isend+irecv message | wall | 100.0 | 150.0 | 200.0 | +100.0 [+100.0 to +100.0] | +50.0 |\n"
        "|  | thread | 25.0 | 30.0 | 36.0 | +11.0 [+10.0 to +12.0] | +6.0 |\n")


def test_the_per_iteration_table_pairs_on_with_off_and_expects_the_added_cpu():
    # expected: 1 collective x 7 µs of added thread CPU / 100 ms = +0.007 %
    assert proof_tables.iteration_markdown(_rows()) == (
        "| scheme | pairs | off ms: median [min-max] | on ms: median [min-max] | on/off per pair: median [min-max] "
        "| recorded collectives / iteration | isends / iteration | expected |\n"
        "| --- | ---: | ---: | ---: | --- | ---: | ---: | ---: |\n"
        "| allreduce | 2 | 100.0 [100.0-100.0] | 102.5 [95.0-110.0] | 1.025 [0.950-1.100] | 1 | 0 | +0.007 % |\n")


def test_without_per_call_rounds_nothing_is_expected():
    rows = [r for r in _rows() if r["kind"] == "train"]
    assert proof_tables.iteration_markdown(rows).splitlines()[-1].endswith("| 1 | 0 | - |")
    with pytest.raises(TestbedError, match="no per-call round"):
        proof_tables.call_markdown(rows)


def test_the_generators_read_an_archived_result(tmp_path):
    dest = _archived(tmp_path, _rows())
    per_iter = proof_tables.GENERATORS["proof_per_iteration"](dest)
    assert "| allreduce | 2 |" in per_iter
    assert "4 ranks of `workloads.train` (CNN on digits, 40 iterations) per run, a pair's two runs at the same" in per_iter
    assert "Entries the counting missed: 0." in per_iter
    per_call = proof_tables.GENERATORS["proof_per_call"](dest)
    assert "2 rounds of 500 calls per setting; recorder entries at the end (rank 0): on 2000, off 0, default 2000; " \
           "isends the wrapper counted (on): 1000." in per_call


def test_a_row_without_its_fields_is_one_line_error(tmp_path):
    rows = _rows()
    del rows[0]["recorded_per_iter"]
    with pytest.raises(TestbedError, match=r"row 0 \(train\): no recorded_per_iter"):
        proof_tables.GENERATORS["proof_per_iteration"](_archived(tmp_path, rows))


def test_a_pair_missing_its_off_run_is_refused():
    rows = [r for r in _rows() if r["kind"] == "train" and r["on"]]
    with pytest.raises(TestbedError, match="allreduce: no pair with both"):
        proof_tables.iteration_markdown(rows)


def test_the_benchmark_records_each_round_of_each_setting():
    micro = {s: {"all_reduce": [1.0 + k, 2.0 + k], "all_reduce_cpu": [3.0 + k, 4.0 + k],
                 "isend": [5.0 + k, 6.0 + k], "isend_cpu": [7.0 + k, 8.0 + k]}
             for k, s in enumerate(("on", "off", "default"))}
    rows = proof_overhead.call_rows(micro, 2)
    assert len(rows) == 8
    assert rows[0] == {"kind": "call", "op": "all_reduce", "clock": "wall", "round": 0, "on": 1.0, "off": 2.0,
                       "default": 3.0}
    assert rows[-1] == {"kind": "call", "op": "isend", "clock": "thread", "round": 1, "on": 8.0, "off": 9.0,
                        "default": 10.0}
    assert proof_tables.check(rows) == rows
