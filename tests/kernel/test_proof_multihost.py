"""Measured from training's start across hosts (issue 40, item 4): rank 0 on another host
(its ``started`` marker in that host's copy of the run directory) or on this one, with the
bottleneck's ends on both hosts; the bytes the summary measured leave out the start-up
traffic that the proof's counters (launch to exit) include. Real sshd hosts
(tests/kernel/sshhosts.py)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import yaml

from .conftest import cli_json

pytest.importorskip("paramiko")
if shutil.which("sshd") is None and not os.path.exists("/usr/sbin/sshd"):
    pytest.skip("no sshd (apt-get install openssh-server): the multi-host tests need real SSH servers",
                allow_module_level=True)

pytestmark = [pytest.mark.kernel, pytest.mark.slow]
SHORT = ["--max-iters", "12", "--eval-every", "6", "--target-acc", "0.3"]


def _dumbbell(lab, name: str, rank0_remote: bool) -> dict:
    """Two workers, one behind s0 here and one behind s1 on h1; the bottleneck s0-s1 crosses.
    Rank 0 is w0 (topology order): behind s1 on h1, or behind s0 here."""
    return {"name": name, "hosts": lab.host_specs()[:1],
            "nodes": {"s0": {"kind": "switch"}, "s1": {"kind": "switch", "host": "h1"},
                      "w0": {"kind": "worker"}, "w1": {"kind": "worker"}},
            "links": [{"endpoints": ["w0", "s1" if rank0_remote else "s0"]},
                      {"endpoints": ["w1", "s0" if rank0_remote else "s1"]},
                      {"endpoints": ["s0", "s1"], "rate": "1gbit", "bottleneck": True}]}


@pytest.mark.parametrize("rank0_remote", [True, False], ids=["rank0-on-h1", "rank0-here"])
def test_a_run_across_hosts_is_measured_from_training_start(clean_lab, tmp_path, rank0_remote):
    name = "tsr" if rank0_remote else "tsl"
    topo = tmp_path / f"{name}.yaml"
    topo.write_text(yaml.safe_dump(_dumbbell(clean_lab, name, rank0_remote)))
    cli_json("up", str(topo))
    try:
        s = cli_json("run", "allreduce", "--testbed", name, "--bw", "200mbit", "--out", str(tmp_path / "runs"),
                     *SHORT)
    finally:
        cli_json("down", name)
    assert (s["status"], s["proof"]) == ("ok", "passed"), s.get("proof_reason")
    place = json.loads((Path(s["run_dir"]) / "placement.json").read_text())
    assert place["ranks"][0]["host"] == ("h1" if rank0_remote else "local")
    b = s["bottleneck"]
    assert b["measured_from"] == "training start", b
    assert b["seconds"] < s["run_s"]  # the ranks' start (torch's import, the rendezvous) left out
    for d in ("forward", "reverse"):  # one direction counted on each host
        key = f"s0-s1 {d}"
        assert 0 < b["links"][key]["bytes"] < s["proof_links"][key]["measured_bytes"], (key, b, s["proof_links"])
