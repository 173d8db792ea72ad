"""Your own training code across a testbed (`testbed run --script` / `-m`), for real.

The shipped example (examples/ddp_digits.py, plain PyTorch, no testbed import) runs under
plain torchrun and, unchanged, across three_switch at 100mbit: the tc-counter proof passes,
its records reach `report` and a real Prometheus. Scripts that fail, never join the process
group (unproven), or try to keep their collectives off the data plane end in an error.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.helpers import dumbbell

from .conftest import cli, cli_json
from .test_monitor import _free_ports, _query

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "ddp_digits.py"
TORCHRUN = Path(sys.executable).with_name("torchrun")


def test_the_example_runs_under_plain_torchrun(tmp_path):
    r = subprocess.run([str(TORCHRUN), "--standalone", "--nproc-per-node", "2", str(EXAMPLE), "40"],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "40 steps on 2 ranks" in r.stdout
    assert float(r.stdout.rsplit("accuracy", 1)[1]) > 0.5  # it learns: 10 classes, chance is 0.1


@pytest.mark.skipif(shutil.which("prometheus") is None, reason="no prometheus binary (apt-get install prometheus)")
def test_the_example_trains_across_three_switch_with_the_proof_report_and_prometheus(tmp_path, clean_kernel):
    (port,) = _free_ports(1)
    runs = tmp_path / "runs"
    mon = cli_json("monitor", "up", "--dir", str(tmp_path / "mon"), "--listen", f"127.0.0.1:{port}",
                   "--scrape-interval", "1s")
    try:
        r = cli("run", "--script", str(EXAMPLE), "--bw", "100mbit", "--out", str(runs), "--json", "--", "60",
                timeout=600)
        assert r.returncode == 0, r.stdout + r.stderr
        s = json.loads(r.stdout)
        assert s["status"] == "ok" and s["proof"] == "passed", s
        assert s["scheme"] == "script:ddp_digits.py" and s["world_size"] == 8 and s["iterations"] == 60
        assert s["final_accuracy"] > 0.5, s
        # the proof compared real bytes: every link carried at least the gradients' all-reduces
        grads = s["mean_payload_bytes"] * s["iterations"]
        for name, row in s["proof_links"].items():
            assert row["bound_bytes"] >= grads and row["measured_bytes"] >= row["bound_bytes"], (name, row)
        # report: the run, by its label, with its accuracy and evaluations
        r = cli("report", str(runs))
        assert r.returncode == 0, r.stderr
        rows = json.loads((runs / "report" / "report.json").read_text())["rows"]
        assert [x["scheme"] for x in rows] == ["script:ddp_digits.py"]
        assert rows[0]["final_accuracy"] == pytest.approx(s["final_accuracy"])
        assert len((Path(s["run_dir"]) / "eval.jsonl").read_text().splitlines()) == 3  # steps 20, 40, 60
        # Prometheus scraped the run's exporter while it ran (last_over_time: the series are stale now)
        prom = mon["prometheus_url"]
        it = _query(prom, f'last_over_time(testbed_train_iterations_total{{run_id="{s["run_id"]}",rank="0"}}[10m])')
        acc = _query(prom, f'last_over_time(testbed_train_accuracy{{run_id="{s["run_id"]}"}}[10m])')
        assert it and float(it[0]["value"][1]) == 60, it
        assert acc and float(acc[0]["value"][1]) == pytest.approx(s["final_accuracy"]), acc
    finally:
        cli("monitor", "down", "--dir", str(tmp_path / "mon"))


SCRIPTS = {
    "fails": "import os, sys\nsys.exit(3 if os.environ['RANK'] == '1' else 0)\n",
    "noinit": "import time\ntime.sleep(0.5)\n",
    "halfinit": "import os\nimport torch.distributed as dist\nif os.environ['RANK'] == '0':\n"
                "    dist.init_process_group('gloo')\n",
    "bypass": "import os\nos.environ['GLOO_SOCKET_IFNAME'] = 'lo'  # keep the collectives off the data plane\n"
              "import torch, torch.distributed as dist\ndist.init_process_group('gloo')\n"
              "dist.all_reduce(torch.ones(1000))\n",
}


def test_failing_silent_and_bypassing_scripts_end_naming_the_rank(tmp_path, clean_kernel):
    topo = tmp_path / "us.yaml"
    topo.write_text(yaml.safe_dump(dumbbell("us", rate="1gbit")))
    for name, body in SCRIPTS.items():
        (tmp_path / f"{name}.py").write_text(body)
    assert cli("up", str(topo)).returncode == 0
    try:
        def run(name, *extra):
            t0 = time.monotonic()
            r = cli("run", "-t", "us", "--script", str(tmp_path / f"{name}.py"), "--out", str(tmp_path / "runs"),
                    *extra, timeout=120)
            assert r.returncode == 1 and "Traceback" not in r.stderr.split("Last lines")[0], r.stderr
            return r.stderr, time.monotonic() - t0

        err, _ = run("fails")
        assert "error: rank 1 (node w1) exited with code 3" in err, err
        err, _ = run("noinit")  # no collective at all: nothing was proven
        assert "error: the run is unproven: the training issued no collective between ranks" in err, err
        err, took = run("halfinit", "--timeout", "15")  # rank 0 waits for rank 1, which left
        assert "no progress from any rank for 15 s" in err and "Rank 1 (node w1) exited 0" in err, err
        err, _ = run("bypass", "--timeout", "60")  # gloo on loopback cannot reach the other node
        assert "error: rank" in err and "exited with code 1" in err and "Connection refused" in err, err
        # a module (-m), found from the directory `testbed run` starts in, recording with the helper
        pkg = tmp_path / "mypkg"
        pkg.mkdir()
        (pkg / "__init__.py").write_text("")
        (pkg / "reduce.py").write_text(
            "import os, torch, torch.distributed as dist\nfrom workloads.records import record\n"
            "assert os.getcwd() == os.environ['TESTBED_RUN_DIR'], os.getcwd()  # every backend: the run directory\n"
            "dist.init_process_group('gloo')\nt = torch.ones(250_000)\ndist.all_reduce(t)\n"
            "record(iter=1, loss=0.0, payload_bytes=t.numel() * 4)\ndist.destroy_process_group()\n")
        r = subprocess.run([sys.executable, "-m", "testbed.cli", "run", "-t", "us", "-m", "mypkg.reduce", "--out",
                            str(tmp_path / "mod"), "--json"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
        s = json.loads(r.stdout)
        assert s["scheme"] == "module:mypkg.reduce" and s["proof"] == "passed" and s["mean_payload_bytes"] == 1e6, s
        statuses = sorted(json.loads((d / "summary.json").read_text())["status"]
                          for d in (tmp_path / "runs").iterdir() if (d / "summary.json").exists())
        assert statuses == ["failed", "failed", "failed", "unproven"], statuses
    finally:
        cli("down", "us")


def test_a_hook_by_import_path_trains_like_the_builtin_allreduce(tmp_path, clean_kernel):
    """torch's own all-reduce hook, named by import path from the user's directory: the same
    accuracy as DDP's built-in all-reduce, its payload measured on the wire."""
    (tmp_path / "myhooks.py").write_text(
        "from torch.distributed.algorithms.ddp_comm_hooks import default_hooks\n"
        "def plain(process_group):\n    return process_group, default_hooks.allreduce_hook\n")
    topo = tmp_path / "hk.yaml"
    topo.write_text(yaml.safe_dump(dumbbell("hk", rate="1gbit")))
    assert cli("up", str(topo)).returncode == 0
    try:
        common = ["-t", "hk", "--max-iters", "30", "--eval-every", "30", "--out", str(tmp_path / "runs"), "--json"]
        builtin = cli_json("run", "allreduce", *common)
        r = subprocess.run([sys.executable, "-m", "testbed.cli", "run", "hook", "--hook", "myhooks:plain", *common],
                           cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
        hooked = json.loads(r.stdout)
        bad = cli("run", "hook", "--hook", "nosuchmodule:factory", *common[:-1])
        assert bad.returncode == 1 and "--hook nosuchmodule:factory: ModuleNotFoundError" in bad.stderr, bad.stderr
    finally:
        cli("down", "hk")
    assert hooked["hook"] == "myhooks:plain" and hooked["proof"] == "passed", hooked
    assert hooked["final_accuracy"] == pytest.approx(builtin["final_accuracy"], abs=0.02), (hooked, builtin)
    # measured on the wire: a 2-rank ring all-reduce sends about the gradients' bytes per rank
    assert 0.8 <= hooked["mean_payload_bytes"] / hooked["dense_bytes"] <= 1.5, hooked
    assert hooked["bottleneck"]["bytes"] >= hooked["mean_payload_bytes"] * hooked["iterations"]


def test_sweeps_over_a_scripts_grid_and_over_hooks_are_grouped_in_the_report(tmp_path, clean_kernel):
    """`sweep --script --param lr=...` runs the script once per value with `--lr V`; `sweep
    --schemes allreduce,hook --param hook=A,B` runs the baseline once and each hook once; the
    report has one row per grid point, and fp16 compression halves the measured payload."""
    (tmp_path / "myhooks.py").write_text(
        "from torch.distributed.algorithms.ddp_comm_hooks import default_hooks\n"
        "def plain(process_group):\n    return process_group, default_hooks.allreduce_hook\n"
        "def half(process_group):\n    return process_group, default_hooks.fp16_compress_hook\n")
    topo = tmp_path / "sw.yaml"
    topo.write_text(yaml.safe_dump(dumbbell("sw", rate="1gbit")))
    runs = tmp_path / "runs"
    assert cli("up", str(topo)).returncode == 0
    try:
        r = cli("sweep", "--script", str(EXAMPLE), "--param", "lr=0.1,0.001", "--bw", "200mbit", "-t", "sw",
                "--out", str(runs), "--json", "--", "40", timeout=600)
        assert r.returncode == 0, r.stdout + r.stderr
        mine = json.loads(r.stdout)
        r = subprocess.run([sys.executable, "-m", "testbed.cli", "sweep", "--schemes", "allreduce,hook", "--param",
                            "hook=myhooks:plain,myhooks:half", "--bw", "200mbit", "--max-iters", "20",
                            "--eval-every", "20", "-t", "sw", "--out", str(runs), "--json"],
                           cwd=tmp_path, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stdout + r.stderr
        hooks = json.loads(r.stdout)
    finally:
        cli("down", "sw")
    assert [(x["params"], x["status"]) for x in mine["runs"]] == [({"lr": "0.1"}, "ok"), ({"lr": "0.001"}, "ok")]
    assert [(x["scheme"], x["params"]) for x in hooks["runs"]] == [
        ("allreduce", {}), ("hook", {"hook": "myhooks:plain"}), ("hook", {"hook": "myhooks:half"})]
    for index in (mine, hooks):
        for x in index["runs"]:
            s = json.loads((Path(index["dir"]) / x["run_id"] / "summary.json").read_text())
            assert s["proof"] == "passed" and s["params"] == x["params"], s
    assert cli("report", mine["dir"], hooks["dir"], "--out", str(runs / "report")).returncode == 0
    rows = {x["scheme"]: x for x in json.loads((runs / "report" / "report.json").read_text())["rows"]}
    assert set(rows) == {"script:ddp_digits.py [lr=0.1]", "script:ddp_digits.py [lr=0.001]", "allreduce",
                         "hook myhooks:plain", "hook myhooks:half"}, set(rows)
    # the grid point reached the script: lr 0.001 barely moves in 40 steps, lr 0.1 learns
    assert rows["script:ddp_digits.py [lr=0.1]"]["final_accuracy"] > \
        rows["script:ddp_digits.py [lr=0.001]"]["final_accuracy"] + 0.2, rows
    plain, half = rows["hook myhooks:plain"], rows["hook myhooks:half"]
    assert 0.4 <= half["payload_bytes_per_iter"] / plain["payload_bytes_per_iter"] <= 0.6, (plain, half)
