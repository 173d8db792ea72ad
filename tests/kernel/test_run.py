"""`testbed run`, `sweep` and `report` end to end: real namespaces, tc shaping, gloo ranks."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from testbed.runs.reports import tensorboard as events
from tests.helpers import dumbbell, records_as_scalars, tensorboard_scalars, three_switch
from tests.kernel.conftest import cli, cli_json, pids_of_this_session, run

pytestmark = [pytest.mark.kernel, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
SHORT = ["--max-iters", "12", "--eval-every", "6", "--target-acc", "0.3"]


def _topology(tmp_path, d: dict) -> Path:
    p = tmp_path / f"{d['name']}.yaml"
    p.write_text(yaml.safe_dump(d))
    return p


def _htb_rates(ns: str, devs=("l2a", "l2b")) -> list[str]:
    """HTB class rates as the kernel reports them (both ends of link 2, the bottleneck)."""
    rates = []
    for dev in devs:
        out = run(["tc", "-n", ns, "class", "show", "dev", dev]).stdout
        rates += [w[i + 1] for w in (l.split() for l in out.splitlines()) for i, x in enumerate(w) if x == "rate"]
    return sorted(rates)


def test_two_schemes_cross_the_shaped_bottleneck_and_report_compares_them(tmp_path, clean_kernel):
    tensorboard = events.available()  # the round trip of its event files too, where TensorBoard is installed
    topo = _topology(tmp_path, dumbbell("rdb", rate="1gbit"))
    runs = tmp_path / "runs"
    summaries = {}
    for scheme in ("allreduce", "pactrain"):
        live = ["--tensorboard"] if scheme == "pactrain" and tensorboard else []
        s = cli_json("run", scheme, "--topology", str(topo), "--bw", "200mbit", "--out", str(runs), *live, *SHORT)
        summaries[scheme] = s
        assert s["status"] == "ok" and s["scheme"] == scheme and s["world_size"] == 2 and s["iterations"] == 12
        assert s["bw"] == "200mbit"
        assert s["bottleneck_shapes"]["s0-s1"]["forward"]["rate"] == "200mbit"
        assert s["final_accuracy"] is not None and s["testbed_version"] and s["code_version"]
        b = s["bottleneck"]
        # 2-rank all-reduce: each rank sends its whole (compact) buffer across the one link,
        # one direction each, so the link carries at least 2 x payload per iteration
        assert b["bytes"] >= 2 * s["mean_payload_bytes"] * s["iterations"]
        assert b["bytes"] <= 2.3 * s["mean_payload_bytes"] * s["iterations"] + 2e6  # headers, eval, setup
        assert 0 < b["max_utilisation"] <= 1.0
        d = Path(s["run_dir"])
        for f in ("run.json", "topology.json", "config.json", "rank0.jsonl", "rank1.jsonl", "rank0.log",
                  "rank1.log", "eval.jsonl", "links.jsonl", "summary.json"):
            assert (d / f).exists(), f
        recs = [json.loads(x) for x in (d / "rank1.jsonl").read_text().splitlines()]
        assert recs[-1]["tx_bytes"] - recs[0]["tx_bytes"] >= 0.9 * sum(r["payload_bytes"] for r in recs[1:])
    # pactrain prunes a pre-trained network by default (made once, cached); allreduce starts from scratch
    assert summaries["pactrain"]["from_scratch"] is False and summaries["pactrain"]["init"]["dataset"] == "digits"
    assert summaries["allreduce"]["from_scratch"] is True and summaries["allreduce"]["init"] is None
    assert [p.name for p in (runs / "checkpoints").glob("*.pt")] == ["cnn-w1-dfull-digits-s0-e2.pt"]
    # dense until the mask tracker is stable (about 4 iterations), then half the entries at a
    # quarter of the bytes each (ternary int8 instead of fp32: pactrain's default, as in the paper)
    assert summaries["pactrain"]["ternary"] is True and summaries["pactrain"]["variant"] == "pactrain"
    assert summaries["pactrain"]["final_payload_bytes"] < 0.15 * summaries["allreduce"]["final_payload_bytes"]
    assert summaries["pactrain"]["bottleneck"]["bytes"] < 0.8 * summaries["allreduce"]["bottleneck"]["bytes"]

    rep = cli_json("report", str(runs))
    rows = {r["scheme"]: r for r in rep["rows"]}
    assert set(rows) == {"allreduce", "pactrain 0.5 ternary"}
    assert rows["allreduce"]["tta_vs_allreduce"] == 1.0 or rows["allreduce"]["tta_s"] is None
    assert rows["pactrain 0.5 ternary"]["payload_bytes_per_iter"] == summaries["pactrain"]["mean_payload_bytes"]
    for f in rep["files"]:
        p = Path(rep["out"]) / f
        head = p.read_bytes()[:8]
        assert head == b"\x89PNG\r\n\x1a\n" or f.endswith((".json", ".csv")), f
    never = cli_json("report", str(runs), "--target-acc", "0.99")["rows"]
    assert [(r["tta_s"], r["reached"], r["ok"]) for r in never] == [(None, 0, 1)] * 2, "shown, not dropped"
    if tensorboard:
        _tensorboard_matches_the_records(Path(summaries["pactrain"]["run_dir"]), runs, tmp_path / "tb")


def _tensorboard_matches_the_records(run_dir: Path, runs: Path, logdir: Path) -> None:
    """The live event files (run --tensorboard) and report --tensorboard's, read back by
    TensorBoard's own reader, hold every record's value at its step."""
    want = records_as_scalars(run_dir)
    assert set(want) == {"rank0", "rank1", "eval", "links"} and want["links"]
    rep = cli_json("report", str(runs), "--tensorboard", str(logdir))
    folders = {Path(r["run"]).name: Path(r["logdir"]) for r in rep["tensorboard"]["runs"]}
    for where in (run_dir / "tensorboard", folders[run_dir.name]):
        for folder, tags in want.items():
            got = tensorboard_scalars(where / folder)
            for tag, values in tags.items():
                assert [(s, pytest.approx(v, rel=1e-6)) for s, v, _ in got[tag]] == values, (where, folder, tag)


def test_an_existing_testbed_is_used_left_up_and_its_shape_restored(tmp_path, clean_kernel):
    topo = _topology(tmp_path, dumbbell("rkeep", rate="300mbit"))
    cli_json("up", str(topo))
    try:
        before = _htb_rates("rkeep")
        s = cli_json("run", "fp16", "--testbed", "rkeep", "--bw", "50mbit", "--out", str(tmp_path / "runs"),
                     "--max-iters", "4")
        assert s["bottleneck_shapes"]["s0-s1"]["reverse"]["rate"] == "50mbit"
        assert _htb_rates("rkeep") == before == ["300Mbit", "300Mbit"]
        assert cli_json("status", "rkeep")["name"] == "rkeep"
    finally:
        cli("down", "rkeep")


def _start_run(tmp_path, name, *extra):
    topo = _topology(tmp_path, dumbbell(name, rate="1gbit"))
    return subprocess.Popen([sys.executable, "-m", "testbed.cli", "run", "allreduce", "--topology", str(topo),
                             "--bw", "100mbit", "--out", str(tmp_path / "runs"), "--max-iters", "100000", *extra],
                            cwd=ROOT, env=dict(os.environ), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for_records(tmp_path, rank=1, lines=3, timeout=120, run=None):
    """The run directory once rank ``rank`` has ``lines`` records; the run's own error when
    ``run`` (its process) ended first."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        found = list((tmp_path / "runs").glob(f"*/rank{rank}.jsonl"))
        if found and len(found[0].read_text().splitlines()) >= lines:
            return found[0].parent
        if run is not None and run.poll() is not None:
            raise AssertionError(f"the run ended before its ranks iterated: {run.communicate()[1][-2000:]}")
        time.sleep(0.3)
    raise AssertionError("the ranks never started iterating")


def _rank_pid(ns: str) -> int:
    """The rank's process in node ``ns`` (a rank forked by the run's zygote has its client beside it)."""
    from testbed.common.procs import argv_of
    from testbed.net.netns import pids_in
    pids = [p for p in pids_in([ns]) if "testbed.nodes.zygote.client" not in argv_of(p)]
    assert len(pids) == 1, pids
    return pids[0]


def test_a_killed_rank_ends_the_run_quickly_and_leaves_nothing(tmp_path, clean_kernel):
    p = _start_run(tmp_path, "rkill")
    run_dir = _wait_for_records(tmp_path)
    os.kill(_rank_pid("rkill.w1"), signal.SIGKILL)
    t0 = time.time()
    _, err = p.communicate(timeout=60)
    assert time.time() - t0 < 15, "the run must end within seconds"
    assert p.returncode == 1
    assert "rank 1 (node w1) was killed by signal 9" in err and "Traceback" not in err.split("Last lines")[0]
    assert (run_dir / "rank0.jsonl").exists(), "records written so far are kept"
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "failed"


def test_ctrl_c_stops_everything(tmp_path, clean_kernel):
    p = _start_run(tmp_path, "rint")
    run_dir = _wait_for_records(tmp_path)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=60)
    assert p.returncode != 0 and "interrupted" in err
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "interrupted"


def _sweep(tmp_path, name: str, *extra: str) -> tuple[subprocess.Popen, Path]:
    topo = _topology(tmp_path, dumbbell(name, rate="1gbit"))
    out = tmp_path / "runs"
    return subprocess.Popen([sys.executable, "-m", "testbed.cli", "sweep", "--schemes", "allreduce,fp16", "--bw",
                             "200mbit", "--topology", str(topo), "--out", str(out), "--max-iters", "100000",
                             "--pretrain-dataset", "synthetic", *extra],
                            cwd=ROOT, env=dict(os.environ), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True), out


def _signal_when(p: subprocess.Popen, ready, sig: int, what: str) -> tuple[str, str]:
    """Send ``sig`` to the sweep ``p`` once ``ready()``; its output. It never outlives the test."""
    try:
        deadline = time.time() + 120
        while not ready():
            assert time.time() < deadline and p.poll() is None, what
            time.sleep(0.2)
        p.send_signal(sig)
        return p.communicate(timeout=60)
    finally:
        p.kill()


def test_ctrl_c_stops_a_sweep_not_only_its_run(tmp_path, clean_kernel):
    """Ctrl-C in a sweep ends the sweep: before, the interrupted run was counted as failed
    and the next one started (seen on the GPU machine, where `timeout -s INT` then had to
    kill it); the index says which run was interrupted, and the sweep's testbed is gone
    (clean_kernel checks that nothing is left)."""
    p, out = _sweep(tmp_path, "rswi", "--pretrain-epochs", "0.2")

    def iterating() -> bool:
        found = list(out.glob("sweep-*/*/rank1.jsonl"))
        return bool(found) and len(found[0].read_text().splitlines()) >= 3

    outs, err = _signal_when(p, iterating, signal.SIGINT, "the first run never started iterating")
    assert p.returncode != 0 and "interrupted" in err, err
    assert "[2/2]" not in outs + err, "the next run must not start"
    index = json.loads(next(out.glob("sweep-*/sweep.json")).read_text())
    assert [(r["scheme"], r["status"]) for r in index["runs"]] == [("allreduce", "interrupted")]
    assert [d.name for d in next(out.glob("sweep-*")).iterdir() if d.is_dir()] == ["allreduce-200mbit-r0"]


def test_sigterm_during_a_sweeps_pretraining_takes_its_testbed_down(tmp_path, clean_kernel):
    """SIGTERM outside any run (here while the sweep pre-trains, after it built its testbed)
    unwinds like Ctrl-C: the pre-training process ends and the testbed is removed; before,
    the sweep died where it stood and left the testbed up."""
    p, _ = _sweep(tmp_path, "rswt", "--pretrain-epochs", "200")
    _, err = _signal_when(p, lambda: bool(pids_of_this_session("workloads.pretrain")), signal.SIGTERM,
                          "the sweep never began pre-training")
    assert p.returncode != 0 and "Traceback" not in err, err
    assert pids_of_this_session("workloads.pretrain") == [], "the pre-training was left running"


def test_a_hung_rank_ends_the_run_after_timeout(tmp_path, clean_kernel):
    # 10 s: at 4 the ranks' own start, quiet for 4 s under the suite's load, ended a run once
    # before they iterated (the final check of 2026-12-07, 84f0029)
    p = _start_run(tmp_path, "rhang", "--timeout", "10")
    _wait_for_records(tmp_path, run=p)
    os.kill(_rank_pid("rhang.w1"), signal.SIGSTOP)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 1 and "no progress from any rank for 10 s" in err


def test_traffic_that_misses_the_bottleneck_fails_loudly(tmp_path, clean_kernel):
    # both workers on one switch; the "bottleneck" leads to an empty switch
    d = {"name": "rbyp", "nodes": {"s0": {"kind": "switch"}, "s1": {"kind": "switch"},
                                   "w0": {"kind": "worker"}, "w1": {"kind": "worker"}},
         "links": [{"endpoints": ["w0", "s0"]}, {"endpoints": ["w1", "s0"]},
                   {"endpoints": ["s0", "s1"], "rate": "100mbit", "bottleneck": True}]}
    r = cli("run", "allreduce", "--topology", str(_topology(tmp_path, d)), "--out", str(tmp_path / "runs"),
            "--max-iters", "3")
    assert r.returncode == 1 and "no collective had to cross the bottleneck link(s) s0-s1" in r.stderr, r.stderr
    s = json.loads(next((tmp_path / "runs").glob("*/summary.json")).read_text())
    assert (s["status"], s["proof"]) == ("unproven", "unproven")


def test_bad_input_creates_nothing(tmp_path, clean_kernel):
    r = cli("run", "topk2", "--out", str(tmp_path / "runs"))
    assert r.returncode == 2 and "unknown scheme 'topk2'; choose one of: allreduce" in r.stderr  # usage: exit 2
    r = cli("run", "pactrain", "--bw", "100mbps")
    assert r.returncode == 1 and "--bw" in r.stderr and "mbit" in r.stderr
    r = cli("run", "pactrain", "--dataset", "cifar10")
    assert r.returncode == 1 and "needs --data-dir" in r.stderr
    if not _cuda():  # NCCL on a host without GPUs: refused before any rank starts, testbed taken down
        topo = _topology(tmp_path, dumbbell("rnogpu", rate="1gbit"))
        r = cli("run", "allreduce", "--backend", "nccl", "--topology", str(topo), "--out", str(tmp_path / "runs"))
        assert r.returncode == 1 and "--backend nccl needs NVIDIA GPUs" in r.stderr and "--backend gloo" in r.stderr
        assert "Traceback" not in r.stderr and "bringing up" not in r.stderr
    assert not (tmp_path / "runs").exists()


def test_sweep_shares_one_checkpoint_and_report_reads_it(tmp_path, clean_kernel):
    """Variants (pactrain:R:ternary from --prune-ratios) are runs of their own, all from one
    checkpoint pre-trained on another dataset, and report keeps them apart."""
    topo = _topology(tmp_path, dumbbell("rswp", rate="1gbit"))
    out = tmp_path / "runs"
    args = ["sweep", "--schemes", "allreduce,pactrain:ternary", "--prune-ratios", "0.3,0.6", "--bw", "100mbit,400mbit",
            "--topology", str(topo), "--out", str(out), "--max-iters", "6", "--pretrain-epochs", "0.3",
            "--pretrain-dataset", "synthetic", "--target-acc", "0.5"]
    index = cli_json(*args)
    assert [r["status"] for r in index["runs"]] == ["ok"] * 6
    assert [r["scheme"] for r in index["runs"][:3]] == ["allreduce", "pactrain:0.3:ternary", "pactrain:0.6:ternary"]
    ckpts = list((out / "checkpoints").glob("*.pt"))
    assert [c.name for c in ckpts] == ["cnn-w1-dfull-synthetic-s0-e0.3.pt"]
    for r in index["runs"]:
        s = json.loads((Path(index["dir"]) / r["run_id"] / "summary.json").read_text())
        assert "--init" in s["request"]["workload_args"] and str(ckpts[0]) in s["request"]["workload_args"]
        assert s["bw"] == r["bw"] and s["variant"] == r["scheme"] and ":" not in r["run_id"]
        assert s["init"]["dataset"] == "synthetic" and s["from_scratch"] is False
        assert s["hyper"]["pretrain_dataset"] == "synthetic" and s["dataset"] == "digits"
        if s["scheme"] == "pactrain":
            assert s["hyper"]["ternary"] is True and s["hyper"]["prune_ratio"] == float(r["scheme"].split(":")[1])
            # a float32 scale per layer and an int8 per kept weight, once the buckets are compact
            assert s["final_payload_bytes"] < 0.3 * (1 - s["prune_ratio"]) * s["dense_bytes"]
    rep = cli_json("report", index["dir"])
    assert {(r["bw"], r["scheme"]) for r in rep["rows"]} == {
        (bw, v) for bw in ("100mbit", "400mbit") for v in ("allreduce", "pactrain 0.3 ternary", "pactrain 0.6 ternary")}
    assert all(r["runs"] == 1 for r in rep["rows"]), "no two variants averaged together"
    assert all(r["iter_time_vs_allreduce"] is not None for r in rep["rows"]), "compared with allreduce from the same checkpoint"
    assert "prune_ratio.png" in rep["files"]
    slow = next(r for r in rep["rows"] if r["bw"] == "100mbit" and r["scheme"] == "allreduce")
    fast = next(r for r in rep["rows"] if r["bw"] == "400mbit" and r["scheme"] == "allreduce")
    assert slow["mean_iter_s"] > fast["mean_iter_s"], "the bottleneck rate shows in the iteration time"


def test_sweep_repeats_start_from_a_checkpoint_each_and_report_pairs_them(tmp_path, clean_kernel):
    """Repeat k of every scheme starts from the checkpoint pre-trained with seed + k (issue
    41: the spread includes pre-training's), and report still reads one row per scheme
    with its repeats paired."""
    topo = _topology(tmp_path, dumbbell("rrep", rate="1gbit"))
    out = tmp_path / "runs"
    index = cli_json("sweep", "--schemes", "allreduce,fp16", "--repeats", "2", "--bw", "200mbit",
                     "--topology", str(topo), "--out", str(out), "--max-iters", "4", "--pretrain-epochs", "0.2",
                     "--pretrain-dataset", "synthetic")
    assert [r["status"] for r in index["runs"]] == ["ok"] * 4
    names = sorted(c.name for c in (out / "checkpoints").glob("*.pt"))
    assert names == ["cnn-w1-dfull-synthetic-s0-e0.2.pt", "cnn-w1-dfull-synthetic-s1-e0.2.pt"]
    started = {}
    for r in index["runs"]:
        assert Path(r["checkpoint"]).name == names[r["repeat"]]
        s = json.loads((Path(index["dir"]) / r["run_id"] / "summary.json").read_text())
        assert r["checkpoint"] in s["request"]["workload_args"]
        started.setdefault(r["repeat"], set()).add(s["init"]["sha256"])
    assert len(started[0]) == len(started[1]) == 1 and started[0] != started[1], "same start per repeat, not across"
    rep = cli_json("report", index["dir"], "--baseline", "allreduce")
    assert sorted((r["scheme"], r["runs"]) for r in rep["rows"]) == [("allreduce", 2), ("fp16", 2)]
    fp16 = next(r for r in rep["rows"] if r["scheme"] == "fp16")
    assert fp16["iter_pairs"] == 2, "repeat k of fp16 is paired with repeat k of allreduce"


def test_compute_time_run_sends_the_real_models_bytes_and_says_accuracy_was_not_measured(tmp_path, clean_kernel):
    topo = _topology(tmp_path, dumbbell("rsyn", rate="1gbit"))
    out = tmp_path / "runs"
    r = cli("run", "pactrain:0.5:ternary", "--compute-time", "0.2", "--pretrain", "--topology", str(topo),
            "--out", str(out), "--max-iters", "3")
    assert r.returncode == 1 and "pre-training does not apply" in r.stderr and not (out / "checkpoints").exists()
    s = cli_json("run", "pactrain:0.5:ternary:stable_iters=1", "--topology", str(topo), "--bw", "100mbit",
                 "--out", str(out), "--model", "resnet18", "--width", "0.25", "--compute-time", "0.2", "--max-iters", "3")
    assert s["status"] == "ok" and s["iterations"] == 3 and s["variant"] == "pactrain:0.5:ternary:stable_iters=1"
    assert (s["compute_time_s"], s["accuracy_measured"], s["final_accuracy"], s["from_scratch"]) == (0.2, False, None,
                                                                                                     True)
    assert not (out / "checkpoints").exists(), "no pre-training for a traffic-only run"
    # ternary compact from the first iteration: about 1/8 of the dense bytes, across the bottleneck
    assert s["final_payload_bytes"] == pytest.approx(s["dense_bytes"] / 8, rel=0.02)
    assert s["bottleneck"]["bytes"] >= 2 * s["mean_payload_bytes"] * s["iterations"]
    recs = [json.loads(x) for x in (Path(s["run_dir"]) / "rank0.jsonl").read_text().splitlines()]
    assert all(x["iter_s"] >= 0.2 for x in recs)
    human = cli("report", s["run_dir"])
    assert human.returncode == 0, human.stderr


def test_placement_aware_schemes_across_three_switch(tmp_path, clean_kernel):
    """Ranks behind two edge switches (three_switch with two workers on each: every rank
    imports torch, 1.5 s of CPU, so four, not eight): each rank is told its switch, and what
    crosses the shaped uplinks per iteration orders the schemes as their designs say."""
    path = _topology(tmp_path, three_switch("rplace", {"w0", "w1", "w4", "w5"}))
    cli_json("up", str(path))
    per_iter = {}
    try:
        for scheme in ("allreduce", "hier-allreduce", "prunex", "spardl"):
            r = cli("run", scheme, "--testbed", "rplace", "--bw", "500mbit", "--out", str(tmp_path / "runs"),
                    "--max-iters", "10", "--eval-every", "10", "--json", "--", "--prunex-prune-at", "0.2",
                    timeout=600)
            assert r.returncode == 0, r.stdout + r.stderr
            s = json.loads(r.stdout)
            assert s["status"] == "ok" and s["world_size"] == 4 and s["iterations"] == 10, s
            d = Path(s["run_dir"])
            told = json.loads((d / "placement.json").read_text())
            assert told["groups"] == [[0, 1], [2, 3]] and told["names"] == ["s1", "s2"]
            seen = json.loads((d / "summary.json").read_text())["placement"]
            assert seen["groups"] == told["groups"] and seen["names"] == told["names"], "ranks built the topology's"
            workers = json.loads((d / "run.json").read_text())["workers"]
            assert [w["switch"] for w in workers] == ["s1"] * 2 + ["s2"] * 2
            per_iter[scheme] = s["bottleneck"]["bytes_per_iteration"]
    finally:
        cli("down", "rplace")
    print("bottleneck bytes per iteration:", per_iter)
    # leaders alone cross the uplinks (a flat all-reduce's ring crosses them twice per direction)
    assert per_iter["hier-allreduce"] < 0.8 * per_iter["allreduce"]
    # prunex: the same hierarchy, and after iteration 2 only the kept half of the channels
    assert per_iter["prunex"] < 0.8 * per_iter["hier-allreduce"]
    # spardl: blocks of 1 % of the entries (value + index)
    assert per_iter["spardl"] < 0.2 * per_iter["allreduce"]


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


@pytest.mark.skipif(not _cuda(), reason="no CUDA GPU: the NCCL path cannot run here")
def test_nccl_ranks_on_the_gpu_cross_the_shaped_links(tmp_path, clean_kernel):
    """NCCL ranks (sharing the GPUs there are: each node is its own NCCL host, held to TCP
    sockets) send every collective through the emulated links: the counters prove it, for
    2 ranks across one shaped link and for 8 ranks behind three_switch's uplinks."""
    topo = _topology(tmp_path, dumbbell("rnccl", rate="1gbit"))
    runs = tmp_path / "runs"
    for scheme in ("allreduce", "pactrain:exact", "pactrain:0.5:ternary"):
        s = cli_json("run", scheme, "--topology", str(topo), "--bw", "200mbit", "--backend", "nccl",
                     "--out", str(runs), *SHORT)
        assert s["status"] == "ok" and s["backend"] == "nccl" and s["iterations"] == 12, s
        print(f"nccl 2 ranks {scheme}: iteration {s['mean_iter_s']:.3f} s, payload {s['mean_payload_bytes']:.0f} B, "
              f"bottleneck {s['bottleneck']['bytes']:.0f} B")
        assert s["bottleneck"]["bytes"] >= 2 * s["mean_payload_bytes"] * s["iterations"], s["bottleneck"]
    three = yaml.safe_load((ROOT / "testbed" / "topologies" / "three_switch.yaml").read_text())
    three["name"] = "rnccl8"
    for scheme in ("allreduce", "pactrain"):
        s = cli_json("run", scheme, "--topology", str(_topology(tmp_path, three)), "--bw", "500mbit",
                     "--backend", "nccl", "--out", str(runs), "--max-iters", "10", "--eval-every", "10", timeout=600)
        assert s["status"] == "ok" and s["backend"] == "nccl" and s["world_size"] == 8, s
        print(f"nccl 8 ranks {scheme}: iteration {s['mean_iter_s']:.3f} s, payload {s['mean_payload_bytes']:.0f} B, "
              f"bottleneck {s['bottleneck']['bytes']:.0f} B")
        # two switch domains of 4: whatever NCCL's algorithm, each rank's share of the
        # all-reduce leaves its domain at least once per direction over the two uplinks
        assert s["bottleneck"]["bytes"] >= s["mean_payload_bytes"] * s["iterations"], s["bottleneck"]
