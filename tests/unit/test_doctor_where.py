"""`testbed doctor` names the machine it checked, and its Slurm node and job where it ran as
a step (`srun -l -N 2 testbed doctor`: one report per node, each saying which)."""

from __future__ import annotations

import json
import os

import pytest

from testbed.cli import main
from testbed.engine import doctor
from testbed.nodes.base import Check


@pytest.fixture
def one_check(monkeypatch):
    monkeypatch.setattr(doctor, "run_checks", lambda: [Check("privileges", True, "running as root", required=True)])


def test_outside_a_job_the_report_names_the_host(monkeypatch, one_check, capsys):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.delenv("SLURMD_NODENAME", raising=False)
    assert doctor.where() == {"host": os.uname().nodename, "slurm_node": None, "slurm_job": None}
    with pytest.raises(SystemExit) as e:
        main(["doctor", "--json"])
    assert e.value.code == 0
    got = json.loads(capsys.readouterr().out)
    assert (got["ok"], got["host"], got["slurm_node"]) == (True, os.uname().nodename, None)


def test_on_a_node_of_a_job_it_names_the_node_and_job(monkeypatch, one_check, capsys):
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    monkeypatch.setenv("SLURMD_NODENAME", "gpu[08]")
    with pytest.raises(SystemExit):
        main(["doctor", "--json"])
    got = json.loads(capsys.readouterr().out)
    assert (got["slurm_node"], got["slurm_job"]) == ("gpu[08]", 42)
    with pytest.raises(SystemExit):
        main(["doctor"])
    text = capsys.readouterr().out
    where = f"host {os.uname().nodename} (Slurm node gpu[08] of job 42)"  # a name is text, never markup
    assert f"testbed doctor on {where}" in text and f"{where}: ready to build testbeds" in text
