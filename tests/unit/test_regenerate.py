"""benchmarks.archive and benchmarks.regenerate: records folders made from (fabricated) run
directories, pages' generated blocks rebuilt and checked against them, and the real pages
in sync with their committed records."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from benchmarks import archive, regenerate

BLOCK = "<!-- regenerate: strong_scaling records=tiny -->\n<!-- /regenerate -->\n"


def _run(d: Path, topology: str, scheme: str, iters: list[float], uplink_bytes: float = 0.0, k: float = 2.0) -> None:
    """A run directory as testbed writes one, in miniature (paths in it absolute, as real)."""
    d.mkdir(parents=True)
    (d / "run.json").write_text(json.dumps({"run_id": d.name, "request": {"scheme": scheme}, "workers": []}))
    links = {"s1-s0 forward": {"bytes": uplink_bytes}} if uplink_bytes else {}
    (d / "summary.json").write_text(json.dumps({
        "run_id": d.name, "run_dir": str(d), "status": "ok", "scheme": scheme, "variant": scheme,
        "topology": topology, "bw": "500mbit", "model": "resnet18", "compute_time_s": 0.2, "dilation": k,
        "iterations": len(iters), "pss_bytes_all_ranks": 1.5e9, "code_version": "abc1234",
        "bottleneck": {"links": links}, "monitoring": {"exporters": ["127.0.0.1:9100"]},
        "error": f"see {d}/rank1.log", "proof_links": {"s1-s0 forward": {"bound_bytes": 10, "from_ranks": [0]}}}))
    t = 1000.0
    with open(d / "rank0.jsonl", "w") as f:
        for i, s in enumerate(iters, 1):
            t += s
            f.write(json.dumps({"rank": 0, "iter": i, "time": t, "iter_s": s, "tx_bytes": 5, "loss": None}) + "\n")
    (d / "links.jsonl").write_text("".join(
        json.dumps({"time": 999.0 + k, "link": "s1-s0", "direction": "forward", "bytes": k * uplink_bytes / 2,
                    "drops": 0, "rate_bps": 5e8, "bytes_per_s": 1.0, "utilisation": 0.1}) + "\n" for k in range(3)))


def _sweep(d: Path) -> Path:
    d.mkdir(parents=True)
    (d / "sweep.json").write_text(json.dumps({"checkpoint": f"{d}/ck.pt", "runs": []}))
    for r, t in enumerate((0.40, 0.42)):
        _run(d / f"allreduce-10gbit-r{r}", "ss2x1", "allreduce", [0.9, t, t])
        _run(d / f"ar2-r{r}", "ss4x2", "allreduce", [0.9, t / 2, t / 2], uplink_bytes=4e6)
    return d


@pytest.fixture
def site(tmp_path: Path) -> tuple[Path, Path, Path]:
    """(docs folder with one page holding a block, its records folder, the page)."""
    src = _sweep(tmp_path / "runs" / "sweep-1")
    docs, page = tmp_path / "docs", tmp_path / "docs" / "results" / "scaling.md"
    records = docs / "results" / "records"
    assert archive.main([str(src), "--name", "tiny", "--records", str(records)]) == 0
    page.write_text(f"# Scaling\n\n{BLOCK}\nAfter.\n")
    assert regenerate.main(["--docs", str(docs)]) == 0
    return docs, records, page


def test_archive_keeps_what_tables_read_and_no_absolute_path(site) -> None:
    _, records, _ = site
    run = records / "tiny" / "sweep-1" / "allreduce-10gbit-r0"
    assert sorted(p.name for p in run.iterdir()) == ["links.jsonl", "rank0.jsonl", "run.json", "summary.json"]
    s = json.loads((run / "summary.json").read_text())
    assert "run_dir" not in s and "monitoring" not in s and s["error"] == "see sweep-1/allreduce-10gbit-r0/rank1.log"
    assert s["proof_links"] == {"s1-s0 forward": {"bound_bytes": 10}}
    first = json.loads((run / "rank0.jsonl").read_text().splitlines()[0])
    assert first == {"iter": 1, "time": 1000.9, "iter_s": 0.9}  # no rank, tx_bytes, nulls
    assert json.loads((records / "tiny" / "sweep-1" / "sweep.json").read_text())["checkpoint"] == "sweep-1/ck.pt"
    text = "".join(p.read_text() for p in (records / "tiny").rglob("*") if p.is_file())
    assert str(records.parents[2]) not in text
    assert len(archive.runs_of(records / "tiny")) == 4


def test_check_passes_in_sync_and_names_the_block_when_a_number_changes(site, capsys) -> None:
    docs, _, page = site
    text = page.read_text()
    assert "| 4 | 2 | allreduce | 2 | 0.200 | 0.205 [0.200-0.210] | 2.00 | 2.00 | 2 | 1.33\\* | 1.50 | 2 |" in text
    assert "| 2 | 1 | allreduce | 2 | 0.200 | 0.410 [0.400-0.420] | 1.00 | 1.00 | 1 | - |" in text and "4 runs (4 ok) of code abc1234" in text
    assert regenerate.main(["--docs", str(docs), "--check"]) == 0
    page.write_text(text.replace("0.205 [0.200-0.210]", "0.305 [0.200-0.210]"))
    capsys.readouterr()
    assert regenerate.main(["--docs", str(docs), "--check"]) == 1
    err = capsys.readouterr().err
    assert f"{page}:3: block `strong_scaling records=tiny` disagrees" in err
    assert "-| 4 | 2 | allreduce | 2 | 0.200 | 0.305" in err and "+| 4 | 2 | allreduce | 2 | 0.200 | 0.205" in err
    assert regenerate.main(["--docs", str(docs)]) == 0 and page.read_text() == text


@pytest.mark.parametrize("spec, says", [
    ("nonesuch records=tiny", "unknown generator 'nonesuch'; choose one of: claims_lr, claims_pactrain"),
    ("strong_scaling records=missing", "no records folder"),
    ("strong_scaling", "takes records=NAME"),
])
def test_a_bad_block_is_a_one_line_error(site, capsys, spec: str, says: str) -> None:
    docs, _, page = site
    page.write_text(f"<!-- regenerate: {spec} -->\n<!-- /regenerate -->\n")
    capsys.readouterr()
    assert regenerate.main(["--docs", str(docs), "--check"]) == 1
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1, err


def test_a_marker_shown_in_fenced_code_is_no_block(site) -> None:
    docs, _, page = site
    page.write_text("Syntax:\n\n    ```text\n    <!-- regenerate: nonesuch records=x -->\n    ```\n\n"
                    "```\n<!-- regenerate: nonesuch -->\n```\n")
    assert regenerate.main(["--docs", str(docs), "--check"]) == 0


def test_a_block_without_its_end_is_an_error(site, capsys) -> None:
    docs, _, page = site
    page.write_text("<!-- regenerate: strong_scaling records=tiny -->\ntext\n")
    assert regenerate.main(["--docs", str(docs)]) == 1
    assert "has no `<!-- /regenerate -->`" in capsys.readouterr().err


def test_archive_refuses_links_and_what_is_no_run(tmp_path: Path, capsys) -> None:
    src = _sweep(tmp_path / "sweep-1")
    records = tmp_path / "records"
    os.symlink(src, tmp_path / "alias")
    (tmp_path / "plain").mkdir()
    link_run = _sweep(tmp_path / "sweep-2")
    os.symlink(src / "ar2-r0", link_run / "planted")
    link_file = _sweep(tmp_path / "sweep-3")
    (link_file / "ar2-r0" / "rank0.jsonl").unlink()
    os.symlink("/etc/passwd", link_file / "ar2-r0" / "rank0.jsonl")
    for bad, says in ((tmp_path / "alias", "is a link"), (tmp_path / "plain", "is not a run, sweep or benchmark result directory"),
                      (link_run, "planted is a link"), (link_file, "rank0.jsonl is a link")):
        capsys.readouterr()
        assert archive.main([str(src), str(bad), "--name", "x", "--records", str(records)]) == 1
        err = capsys.readouterr().err
        assert says in err and err.count("\n") == 1, err
        assert not (records / "x").exists()  # refused before anything was written


def test_dilation_table_per_k(tmp_path: Path) -> None:
    """benchmarks.dilation's runs (one directory each) give docs/dilation.md's table."""
    for k, t in ((1, 0.5), (4, 0.4)):
        for rep in range(2):
            d = tmp_path / "runs" / f"r-k{k}-{rep}"
            _run(d, "dilss8x2", "allreduce", [0.9, t + rep * 0.01, t + rep * 0.01, t])
            s = json.loads((d / "summary.json").read_text())
            (d / "summary.json").write_text(json.dumps({**s, "dilation": k, "run_s": 10.0}))
    records = tmp_path / "records"
    assert archive.main([*map(str, sorted((tmp_path / "runs").iterdir())), "--name", "dil",
                         "--records", str(records)]) == 0
    assert regenerate.dilation(records / "dil").splitlines()[2:] == [
        "| 1 | 2 | 505.0 | 500.0-510.0 | 1.000 | 10.0 |", "| 4 | 2 | 405.0 | 400.0-410.0 | 0.802 | 40.0 |"]


def test_the_published_pages_agree_with_their_records(capsys) -> None:
    assert regenerate.main(["--check"]) == 0, capsys.readouterr().err


def test_the_table_takes_each_configurations_main_k_and_the_validation_shows_every_k(tmp_path: Path) -> None:
    """Records holding a sweep at K = 2, --validate's run at 4 and auto's ladder at 1: the
    table reads the K = 2 runs only; the validation table shows each K and whether it agrees
    with the one before it within 5 %."""
    from benchmarks import strong_scaling
    from testbed.runs.reports.report import find_runs

    for r, t in enumerate((0.20, 0.21)):
        _run(tmp_path / f"ar-r{r}", "ss4x2", "allreduce", [0.9, t, t], uplink_bytes=4e6, k=2.0)
    _run(tmp_path / "ar-2k", "ss4x2", "allreduce", [0.9, 0.2, 0.2], uplink_bytes=4e6, k=4.0)
    _run(tmp_path / "ar-k1", "ss4x2", "allreduce", [0.9, 0.3, 0.3], uplink_bytes=4e6, k=1.0)
    runs = find_runs([tmp_path / d for d in ("ar-r0", "ar-r1", "ar-2k", "ar-k1")])
    _, rows = strong_scaling.table(runs)
    assert [(w["runs"], w["k"], round(w["iter_s"], 3)) for w in rows] == [(2, 2.0, 0.205)]
    got = strong_scaling.validation_markdown(runs)
    assert "| 4 | 2 | allreduce | 1: 300.0 (1), 2: 205.0 (2), 4: 200.0 (1) |" in got
    assert "2 vs 1: -31.7 % (differ), 4 vs 2: -2.4 % (agree)" in got


def test_archive_keeps_the_link_samples_that_bound_the_timed_iterations(tmp_path: Path) -> None:
    """thin_links keeps, per direction, the first and last samples and those around the
    timed window (wall clock, iter_s x K): steady_wire gives the same bytes from them."""
    from benchmarks.paper_scale import steady_wire
    from testbed.runs.reports.rundata import RunData

    k, wall = 8.0, 2.0
    iters = "".join(json.dumps({"time": 1000.0 + i * wall, "iter_s": wall / k}) + "\n" for i in range(1, 5))
    links = "".join(json.dumps({"time": 1000.0 + t * 0.5, "link": f"s{j}-s0", "direction": "forward",
                                "bytes": (j + 1) * t * 0.25e6}, separators=(",", ":")) + "\n"
                    for j in range(2) for t in range(24))
    thin = archive.thin_links(links, iters, k)
    assert len(thin.splitlines()) == 2 * 4  # per direction: first, last, and the window's ends (on samples here)
    summary = {"dilation": k, "iterations": 4, "bottleneck": {"links": {"s1-s0 forward": {"bytes": 1.0}}}}
    for text, d in ((links, tmp_path / "full"), (thin, tmp_path / "thin")):
        d.mkdir()
        (d / "rank0.jsonl").write_text(iters)
        (d / "links.jsonl").write_text(text)
    full, kept = (steady_wire(RunData(d, summary)) for d in (tmp_path / "full", tmp_path / "thin"))
    assert full == kept and full[1] is True
