"""`testbed selftest` end to end: real namespaces, tc shaping, iperf3, a gloo run."""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys
import time

import pytest

from testbed.nodes.gpus import gpu_names

from .conftest import _processes_naming, cli

pytestmark = [pytest.mark.kernel, pytest.mark.slow]

CPU_CHECKS = ["TCP goodput at 50mbit", "TCP goodput at 200mbit", "TCP goodput at 1gbit",
              "live rate change 500mbit -> 100mbit", "netem delay 10ms", "netem loss 2%",
              "2-rank allreduce run (200mbit)"]


@pytest.fixture
def tmpdir_env(tmp_path):
    """TMPDIR for the self-test's scratch directory, to see that it is removed."""
    d = tmp_path / "tmp"
    d.mkdir()
    return {"TMPDIR": str(d)}, d


def test_selftest_json_rows_and_exit_status(clean_kernel, tmpdir_env):
    env, tmp = tmpdir_env
    t = time.monotonic()
    r = cli("selftest", "--json", env=env, timeout=300)
    took = time.monotonic() - t
    res = json.loads(r.stdout)  # exactly one JSON object on stdout
    print(f"selftest took {took:.1f} s: " + "; ".join(f"{x['check']} {x['verdict']} {x['measured']}"
                                                     for x in res["rows"]))
    assert [x["check"] for x in res["rows"]] == CPU_CHECKS
    assert all(set(x) == {"check", "expected", "measured", "verdict", "detail", "data"} for x in res["rows"])
    assert r.returncode == (0 if res["ok"] else 1), r.stderr
    assert res["ok"], f"this machine should give faithful results: {res['failed']}"
    assert "Traceback" not in r.stderr
    by = {x["check"]: x for x in res["rows"]}
    netem = res["machine"]["netem_missing"]
    for c in ("netem delay 10ms", "netem loss 2%"):
        if netem:
            assert by[c]["verdict"] == "skip" and by[c]["detail"] == "skipped: no netem in this kernel", by[c]
        else:
            assert by[c]["verdict"] == "pass", by[c]
    for rate in ("50mbit", "200mbit", "1gbit"):
        g = by[f"TCP goodput at {rate}"]
        assert g["verdict"] == "pass" and 0.85 <= g["data"]["ratio"] <= 1.05, g
    change = by["live rate change 500mbit -> 100mbit"]["data"]
    assert 0.85 <= change["before_ratio"] <= 1.05 and 0.85 <= change["after_ratio"] <= 1.05, change
    run = by["2-rank allreduce run (200mbit)"]
    assert run["verdict"] == "pass" and (run["data"]["status"], run["data"]["proof"]) == ("ok", "passed"), run
    assert res["seconds"] < 90, "about a minute on a 2-core machine"
    assert not list(tmp.glob("testbed-selftest-*")), "the scratch directory is removed"
    assert not _processes_naming("testbed-selftest-"), "no iperf3 left"


def test_a_failed_check_exits_1_with_one_line_per_failed_row(clean_kernel, tmpdir_env):
    """Thresholds no link can meet: the goodput and rate-change rows fail; each says why in one line."""
    env, tmp = tmpdir_env
    code = ("import testbed.runs.selftest_net as n; n.GOODPUT_MAX = 0.5; n.GOODPUT_RATES = ('50mbit',); "
            "n.GOODPUT_TRIES = 1; from testbed.cli import main; main(['selftest'])")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env={**os.environ, **env})
    assert r.returncode == 1, r.stdout + r.stderr
    lines = [x for x in r.stderr.splitlines() if x.startswith("selftest failed: ")]
    assert len(lines) == 2, r.stderr
    assert lines[0].startswith("selftest failed: TCP goodput at 50mbit: measured ") and "expected 0.85-0.5" in lines[0]
    assert lines[1].startswith("selftest failed: live rate change 500mbit -> 100mbit: measured ")
    assert re.search(r"^NOT faithful: \d passed, 2 failed, \d skipped in \d+ s$", r.stdout, re.M), r.stdout
    assert "Traceback" not in r.stderr
    assert not list(tmp.glob("testbed-selftest-*"))


@pytest.mark.skipif(bool(gpu_names()), reason="this machine has a GPU (nvidia-smi lists one)")
def test_gpu_without_a_gpu_is_refused_in_one_line_before_anything_is_built(clean_kernel):
    r = cli("selftest", "--gpu", timeout=60)
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.strip().splitlines() == [
        "error: --gpu: no NVIDIA GPU found on this machine (`nvidia-smi -L` lists none; is the NVIDIA driver "
        "installed?)"], r.stderr
    j = cli("selftest", "--gpu", "--json", timeout=60)
    assert j.returncode == 1 and "no NVIDIA GPU found" in json.loads(j.stdout)["error"]


def test_ctrl_c_mid_flow_removes_everything(clean_kernel, tmpdir_env):
    env, tmp = tmpdir_env
    p = subprocess.Popen([sys.executable, "-m", "testbed.cli", "selftest"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env={**os.environ, **env})
    seen, deadline = "", time.monotonic() + 120
    while "TCP goodput at 200mbit" not in seen and time.monotonic() < deadline and p.poll() is None:
        if select.select([p.stderr], [], [], 1)[0]:
            seen += p.stderr.readline()
    time.sleep(1.5)  # iperf3 is sending
    assert _processes_naming("testbed-selftest-"), f"an iperf3 flow runs: {seen}"
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 130, seen + err
    assert "interrupted" in err and "Traceback" not in err
    assert not _processes_naming("testbed-selftest-"), "no iperf3 left"
    assert not list(tmp.glob("testbed-selftest-*"))
