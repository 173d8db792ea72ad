"""`testbed doctor` names the machine it checked, and its Slurm node and job where it ran as
a step (`srun -l -N 2 testbed doctor`: one report per node, each saying which)."""

from __future__ import annotations

import json
import os
import signal

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
    monkeypatch.setenv("SLURMD_NODENAME", "gpu08")
    with pytest.raises(SystemExit):
        main(["doctor", "--json"])
    got = json.loads(capsys.readouterr().out)
    assert (got["slurm_node"], got["slurm_job"]) == ("gpu08", 42)
    with pytest.raises(SystemExit):
        main(["doctor"])
    text = capsys.readouterr().out
    where = f"host {os.uname().nodename} (Slurm node gpu08 of job 42)"
    assert f"testbed doctor on {where}" in text and f"{where}: ready to build testbeds" in text


@pytest.mark.parametrize("name,value", [("SLURMD_NODENAME", "gpu[08]"), ("SLURM_JOB_ID", "4²")])
def test_a_slurm_variable_that_is_not_slurms_is_refused_in_one_line_before_the_checks(monkeypatch, capsys,
                                                                                      name, value):
    """Not a node name (nor markup: ``[08]`` is printed as written) / not a job id (a
    superscript is a digit to ``str.isdigit``, not to ``int``): one line naming it, exit 1."""
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    monkeypatch.setenv("SLURMD_NODENAME", "gpu08")
    monkeypatch.setenv(name, value)
    monkeypatch.setattr(doctor, "run_checks", lambda: pytest.fail("the checks ran"))
    kept = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        with pytest.raises(SystemExit) as e:
            main(["doctor"])
    finally:  # a failing command ignores SIGINT and SIGTERM on its way out (render.quiet_exit): not
        for s, h in kept.items():  # this test process's, whose later children would inherit it
            signal.signal(s, h)
    assert e.value.code == 1
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith(f"error: {name}={value!r} is not a ") and err[1].startswith("  hint: ") and len(err) == 2
