"""The report's table: grouping, labels and normalisation (logic only; the kernel tests
run `testbed report` on real runs)."""

from pathlib import Path

from testbed.runs.reports.report import RunData, table


def _run(scheme, world, iter_s, **kw):
    s = {"scheme": scheme, "world_size": world, "bw": "100mbit", "status": "ok", "mean_iter_s": iter_s,
         "mean_payload_bytes": 10.0, "final_accuracy": 0.9, **kw}
    return RunData(Path(f"/runs/{scheme}-{world}"), s)


def test_new_schemes_are_labelled_with_their_parameter():
    rows = table([_run("allreduce", 8, 2.0), _run("spardl", 8, 1.0, spardl_density=0.01),
                  _run("prunex", 8, 1.5, prunex_sparsity=0.5), _run("hier-allreduce", 8, 1.8)])
    assert [r["scheme"] for r in rows] == ["allreduce", "hier-allreduce", "prunex 0.5", "spardl 0.01"]
    assert {r["scheme"]: r["iter_time_vs_allreduce"] for r in rows}["spardl 0.01"] == 0.5


def test_pactrain_says_whether_it_quantised_and_older_summaries_keep_their_label():
    runs = [_run("pactrain", 8, 1.0, prune_ratio=0.5, ternary=True), _run("pactrain", 8, 1.0, prune_ratio=0.5,
                                                                            ternary=False),
            _run("pactrain", 8, 1.0, prune_ratio=0.5)]
    assert [r.label for r in runs] == ["pactrain 0.5 ternary", "pactrain 0.5 exact", "pactrain 0.5"]


def test_runs_of_several_world_sizes_are_kept_apart_and_compared_within_their_size():
    rows = table([_run("allreduce", 2, 1.0), _run("spardl", 2, 2.0, spardl_density=0.01),
                  _run("allreduce", 8, 4.0), _run("spardl", 8, 2.0, spardl_density=0.01)])
    got = {r["scheme"]: (r["world_size"], r["iter_time_vs_allreduce"]) for r in rows}
    assert got == {"allreduce (2 ranks)": (2, 1.0), "spardl 0.01 (2 ranks)": (2, 2.0),
                   "allreduce (8 ranks)": (8, 1.0), "spardl 0.01 (8 ranks)": (8, 0.5)}


def _hrun(name, scheme, acc, iter_s=1.0, tta=None, **hyper):
    base = {"model": "cnn", "dataset": "digits", "batch_size": 32, "lr": 0.05, "init": "ck.pt"}
    s = {"scheme": scheme, "world_size": 8, "bw": "100mbit", "status": "ok", "mean_iter_s": iter_s,
         "mean_payload_bytes": 10.0, "final_accuracy": acc, "hyper": {**base, **hyper},
         "target_accuracy": 0.9, "time_to_target_s": tta}
    if scheme == "topk":
        s["topk_ratio"] = hyper.get("topk_ratio")
    return RunData(Path(f"/runs/{name}"), s)


def test_variants_that_differ_in_any_hyper_parameter_are_never_averaged():
    runs = [_hrun("a0", "allreduce", 0.95, 2.0, 10), _hrun("a1", "allreduce", 0.97, 2.2, 12),
            _hrun("a2", "allreduce", 0.96, 2.1, 11),
            _hrun("t1", "topk", 0.90, 1.0, 20, topk_ratio=0.1), _hrun("t2", "topk", 0.80, 0.5, None, topk_ratio=0.01),
            # same short label (same ratio) but another lr: a row of its own, told apart by lr
            _hrun("t3", "topk", 0.70, 0.5, None, topk_ratio=0.01, lr=0.1),
            # another model: never compared with the cnn's allreduce
            _hrun("v1", "allreduce", 0.5, 9.0, None, model="vit_b16")]
    rows = {r["scheme"]: r for r in table(runs)}
    assert set(rows) == {"allreduce [model=cnn]", "allreduce [model=vit_b16]", "topk 0.1",
                         "topk 0.01 [lr=0.05]", "topk 0.01 [lr=0.1]"}
    a = rows["allreduce [model=cnn]"]
    assert (a["runs"], a["final_accuracy"], a["final_accuracy_min"], a["final_accuracy_max"]) == (3, 0.96, 0.95, 0.97)
    assert (a["tta_s"], a["tta_min_s"], a["tta_max_s"]) == (11, 10, 12)
    assert rows["topk 0.1"]["iter_time_vs_allreduce"] == 1.0 / 2.1
    assert rows["topk 0.01 [lr=0.05]"]["final_accuracy"] == 0.80
    assert rows["topk 0.01 [lr=0.1]"]["final_accuracy"] == 0.70
    assert rows["allreduce [model=vit_b16]"]["iter_time_vs_allreduce"] == 1.0  # its own baseline


def test_a_repeat_that_missed_the_target_counts_as_not_reached_in_the_median():
    runs = [_hrun("a0", "allreduce", 0.95, 2.0, 10), _hrun("a1", "allreduce", 0.95, 2.0, None),
            _hrun("a2", "allreduce", 0.95, 2.0, None), _hrun("b0", "fp16", 0.95, 2.0, 5),
            _hrun("b1", "fp16", 0.95, 2.0, 7), _hrun("b2", "fp16", 0.95, 2.0, None)]
    rows = {r["scheme"]: r for r in table(runs)}
    assert rows["allreduce"]["tta_s"] is None and rows["allreduce"]["reached"] == 1  # median is "not reached"
    assert (rows["fp16"]["tta_s"], rows["fp16"]["tta_min_s"], rows["fp16"]["tta_max_s"]) == (7, 5, None)


def _write_run(d: Path, scheme: str, bw: str, iter_s: float, hyper: dict, **extra) -> None:
    """A run directory as `testbed run` leaves it, with one second of samples per record."""
    import json

    def jsonl(name, recs):
        (d / name).write_text("".join(json.dumps(r) + "\n" for r in recs))

    d.mkdir(parents=True)
    (d / "run.json").write_text(json.dumps({"run_id": d.name, "request": {"scheme": scheme, "bw": bw}}))
    (d / "summary.json").write_text(json.dumps({
        "scheme": scheme, "world_size": 2, "bw": bw, "status": "ok", "mean_iter_s": iter_s, "final_accuracy": 0.9,
        "mean_payload_bytes": 1e6, "bottleneck": {"bytes_per_iteration": 2e6}, "hyper": hyper, **hyper, **extra}))
    jsonl("eval.jsonl", [{"train_s": 2.0 * k, "accuracy": 0.5 + 0.1 * k} for k in range(4)])
    jsonl("links.jsonl", [{"time": 100.0 + t, "link": "s1-s0", "direction": d_, "rate_bps": 1e8,
                           "bytes_per_s": 1e6 * (t % 3 + 1), "utilisation": 0.1 * t}
                          for t in range(6) for d_ in ("ab", "ba")])
    jsonl("rank0.jsonl", [{"iter": k, "time": 100.5 + k, "iter_s": iter_s} for k in range(5)])
    if extra.get("bw_trace"):
        jsonl("trace.jsonl", [{"event": "step", "time": 102.0, "rate": "50mbit"}, {"event": "step", "rate": "x"}])
    if extra.get("cross_traffic"):
        jsonl("traffic.jsonl", [{"time": 101.0 + t, "label": "w0->w1", "bits_per_second": 2e7} for t in range(3)])


def test_write_makes_the_table_files_and_one_figure_each(tmp_path):
    """report.json, report.csv and every figure, named as the docs say: prune_ratio.png only
    when PacTrain runs span ratios, a timeline only for runs whose links changed or were shared."""
    import csv
    import json

    from testbed.runs.reports.report import find_runs, write

    runs = tmp_path / "sweep"
    _write_run(runs / "a", "allreduce", "100mbit", 2.0, {})
    _write_run(runs / "p5", "pactrain", "100mbit", 1.0, {"prune_ratio": 0.5})
    _write_run(runs / "p8", "pactrain", "100mbit", 0.8, {"prune_ratio": 0.8})
    _write_run(runs / "tr", "allreduce", "trace t.csv", 1.5, {}, bw_trace={"file": "t.csv"})
    _write_run(runs / "ct", "allreduce", "100mbit", 2.5, {"lr": 0.1}, cross_traffic=[{"flow": 0}])
    (runs / "torn").mkdir()
    (runs / "torn" / "run.json").write_text("{}")
    (runs / "torn" / "summary.json").write_text("{torn")
    warnings = []
    found = find_runs([runs], warnings.append)
    assert [r.path.name for r in found] == ["a", "ct", "p5", "p8", "tr"] and "torn" in warnings[0]

    got = write(found, tmp_path / "report", target=0.7)
    assert got["files"] == ["report.json", "report.csv", "proof.csv", "tta.png", "accuracy.png", "bytes.png", "prune_ratio.png",
                            "utilisation.png", "timeline-ct.png", "timeline-tr.png"]
    assert all((tmp_path / "report" / f).stat().st_size > 1000 for f in got["files"][3:])
    saved = json.loads((tmp_path / "report" / "report.json").read_text())
    assert saved["rows"] == got["rows"] and len(saved["runs"]) == 5
    with open(tmp_path / "report" / "report.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["scheme"] for r in rows] == [r["scheme"] for r in got["rows"]] and list(rows[0])[-1] == "failed"
    assert {r["scheme"]: r["tta_s"] for r in got["rows"]}["pactrain 0.5"] == 4.0  # accuracy 0.7 at the 3rd eval


def _urun(name, acc, params, args="40"):
    s = {"scheme": "script:train.py", "world_size": 8, "bw": "100mbit", "status": "ok", "mean_iter_s": 1.0,
         "final_accuracy": acc, "hyper": {"args": args}, "params": params}
    return RunData(Path(f"/runs/{name}"), s)


def test_runs_of_your_own_code_are_grouped_by_the_sweeps_grid_point_and_arguments():
    rows = {r["scheme"]: r for r in table([
        _urun("a0", 0.9, {"lr": "0.1"}), _urun("a1", 0.8, {"lr": "0.1"}), _urun("b0", 0.5, {"lr": "0.01"}),
        _urun("c0", 0.7, {"lr": "0.01"}, args="80")])}
    assert set(rows) == {"script:train.py [args=40, lr=0.1]", "script:train.py [args=40, lr=0.01]",
                         "script:train.py [args=80, lr=0.01]"}
    a = rows["script:train.py [args=40, lr=0.1]"]
    assert (a["runs"], a["final_accuracy_min"], a["final_accuracy_max"]) == (2, 0.8, 0.9)


def test_a_grid_key_the_trainer_records_itself_is_not_counted_twice_and_hooks_are_named():
    hooked = _hrun("h", "hook", 0.9, hook="m:plain")
    hooked.summary.update(hook="m:plain", params={"hook": "m:plain", "lr": "0.05"})
    rows = table([hooked, _hrun("a", "allreduce", 0.9)])
    assert {r["scheme"] for r in rows} == {"allreduce", "hook m:plain"}
    assert [r["hyper"] for r in rows if r["base_scheme"] == "hook"][0]["lr"] == 0.05


def test_hostile_run_directories_are_reported_without_the_values_of_the_wrong_type(tmp_path):
    """summary.json and the JSONL files are untrusted input: 47 of 741 mutations crashed
    `report` (a bottleneck that is a string, a scheme that is a number, a hyper value that is
    a list, an evaluation without train_s, a link sample without a time)."""
    import json

    from testbed.runs.reports.report import find_runs, write

    runs = tmp_path / "sweep"
    _write_run(runs / "a", "allreduce", "100mbit", 2.0, {})
    _write_run(runs / "p", "pactrain", "100mbit", 1.0, {"prune_ratio": [0.5]}, bottleneck="x",
               mean_payload_bytes="x", ternary="yes", final_accuracy=float("inf"))
    summary = json.loads((runs / "p" / "summary.json").read_text())
    (runs / "p" / "summary.json").write_text(json.dumps({**summary, "scheme": -1}))
    with open(runs / "p" / "eval.jsonl", "a") as f:
        f.write('{"accuracy": 0.99}\n{"train_s": null, "accuracy": 0.99}\n')
    with open(runs / "p" / "links.jsonl", "a") as f:
        f.write('{"time": null, "link": "s1-s0", "direction": "ab", "utilisation": 0.5}\n')
    warnings = []
    found = find_runs([runs], warnings.append)
    p = next(r for r in found if r.path.name == "p")
    assert {"scheme", "bottleneck", "mean_payload_bytes", "ternary", "final_accuracy", "hyper.prune_ratio"} <= \
        {w for m in warnings for w in m.split("summary.json's ")[-1].split(" had")[0].split(", ")}, warnings
    assert len(p.evals) == 4 and len(p.links) == 12
    got = write(found, tmp_path / "report", target=0.7)
    assert "report.csv" in got["files"] and len(got["rows"]) == 2


def test_only_proven_runs_are_ranked_unless_unproven_ones_are_asked_for():
    runs = [_run("allreduce", 2, 1.0), _run("allreduce", 2, 3.0, status="unproven"),
            _run("allreduce", 2, 9.0, status="bypassed"), _run("allreduce", 2, 9.0, status="failed")]
    (row,) = table(runs)
    assert (row["ok"], row["mean_iter_s"], row["unproven_included"]) == (1, 1.0, 0)
    assert row["failed"] == ["allreduce-2: unproven", "allreduce-2: bypassed", "allreduce-2: failed"]
    (row,) = table(runs, include_unproven=True)
    assert (row["ok"], row["mean_iter_s"], row["unproven_included"]) == (2, 2.0, 1)  # never the bypassed one
    assert row["failed"] == ["allreduce-2: bypassed", "allreduce-2: failed"]


def test_proof_csv_has_a_row_per_run_link_and_direction(tmp_path):
    import csv

    from testbed.runs.reports.report import find_runs, write

    links = {"s1-s0 forward": {"bound_bytes": 100, "shared_bound_bytes": 0, "measured_bytes": 190},
             "s1-s0 reverse": {"bound_bytes": 100, "shared_bound_bytes": 0, "measured_bytes": "lots"}}
    _write_run(tmp_path / "runs" / "a", "allreduce", "100mbit", 2.0, {}, proof="passed", proof_links=links)
    _write_run(tmp_path / "runs" / "b", "allreduce", "100mbit", 2.0, {}, proof_links=["not", "a", "dict"])
    write(find_runs([tmp_path / "runs"]), tmp_path / "report")
    with open(tmp_path / "report" / "proof.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["run_id"], r["link"], r["direction"], r["bound_bytes"], r["measured_bytes"]) for r in rows] == [
        ("a", "s1-s0", "forward", "100", "190"), ("a", "s1-s0", "reverse", "100", "")]  # a bad value left out
    assert rows[0]["status"] == "ok" and rows[0]["proof"] == "passed"


def test_a_nested_oversized_or_foreign_run_is_skipped_naming_its_file_and_the_rest_is_written(tmp_path):
    from testbed.common.files import LIMITS
    from testbed.runs.reports.report import find_runs, write

    runs = tmp_path / "sweep"
    _write_run(runs / "a", "allreduce", "100mbit", 2.0, {})
    _write_run(runs / "deep", "allreduce", "100mbit", 2.0, {})
    (runs / "deep" / "summary.json").write_text('{"x": ' + "[" * 100000 + "]" * 100000 + "}")
    _write_run(runs / "big", "allreduce", "100mbit", 2.0, {})
    with open(runs / "big" / "eval.jsonl", "ab") as f:
        f.truncate(LIMITS["records"] + 1)
    _write_run(runs / "foreign", "allreduce", "100mbit", 2.0, {})
    (runs / "foreign" / "summary.json").unlink()
    (runs / "foreign" / "run.json").write_text('{"something": "else"}')
    warnings = []
    found = find_runs([runs], warnings.append)
    assert [r.path.name for r in found] == ["a"]
    assert len(warnings) == 3, warnings
    assert any(str(runs / "deep" / "summary.json") in w and "nested" in w for w in warnings), warnings
    assert any(str(runs / "big" / "eval.jsonl") in w and "MiB" in w for w in warnings), warnings
    assert any(str(runs / "foreign") in w and "run.json" in w for w in warnings), warnings
    assert write(found, tmp_path / "report")["files"][:3] == ["report.json", "report.csv", "proof.csv"]
