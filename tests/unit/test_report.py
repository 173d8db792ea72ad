"""The report's table: grouping, labels and normalisation (logic only; the kernel tests
run `testbed report` on real runs)."""

from pathlib import Path

from testbed.report import RunData, table


def _run(scheme, world, iter_s, **kw):
    s = {"scheme": scheme, "world_size": world, "bw": "100mbit", "status": "ok", "mean_iter_s": iter_s,
         "mean_payload_bytes": 10.0, "final_accuracy": 0.9, **kw}
    return RunData(Path(f"/runs/{scheme}-{world}"), s)


def test_new_schemes_are_labelled_with_their_parameter():
    rows = table([_run("allreduce", 8, 2.0), _run("spardl", 8, 1.0, spardl_density=0.01),
                  _run("prunex", 8, 1.5, prunex_sparsity=0.5), _run("hier-allreduce", 8, 1.8)])
    assert [r["scheme"] for r in rows] == ["allreduce", "hier-allreduce", "prunex 0.5", "spardl 0.01"]
    assert {r["scheme"]: r["iter_time_vs_allreduce"] for r in rows}["spardl 0.01"] == 0.5


def test_runs_of_several_world_sizes_are_kept_apart_and_compared_within_their_size():
    rows = table([_run("allreduce", 2, 1.0), _run("spardl", 2, 2.0, spardl_density=0.01),
                  _run("allreduce", 8, 4.0), _run("spardl", 8, 2.0, spardl_density=0.01)])
    got = {r["scheme"]: (r["world_size"], r["iter_time_vs_allreduce"]) for r in rows}
    assert got == {"allreduce (2 ranks)": (2, 1.0), "spardl 0.01 (2 ranks)": (2, 2.0),
                   "allreduce (8 ranks)": (8, 1.0), "spardl 0.01 (8 ranks)": (8, 0.5)}
