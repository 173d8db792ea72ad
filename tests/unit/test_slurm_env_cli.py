"""No traceback from any CLI command for any value of SLURM_* (issue 56, class 4, "hostile
job environments"): ``testbed validate --hosts slurm``, ``testbed up --hosts slurm`` (with a
state directory that does not exist: it must fail before making anything) and ``testbed
doctor``, each run as a child with hostile values of SLURM_JOB_ID, SLURM_JOB_NODELIST and
SLURMD_NODENAME (tests/hostile_slurm.py), under a 1 GiB address-space limit. Each must end
with exit status 1 and one line of error (and its hint) naming the variable that is wrong,
no traceback, in bounded time and peak memory.

Where every variable is valid the job still cannot be used here: ``scontrol`` is a stand-in
that fails with several lines, which must come out on one. The test imports nothing of
testbed, so it runs against an older tree too (PYTHONPATH)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from tests.hostile_slurm import job_ids, node_lists, node_names, valid_job_id, valid_node_name

pytestmark = pytest.mark.slow  # real CLI processes per example: the suite runs them, the quick pass does not

LIMIT_AS = 1 << 30  # the CLI needs about 300 MB of address space; a product of ranges multiplied out, far more
MAX_RSS_MB = 200  # the CLI's peak is about 30 MB
TIMEOUT_S = 30.0
MAX_ARG_STRLEN = 131072
"""Bytes of the longest ``NAME=VALUE`` (with its NUL) Linux passes in an environment: a longer
value is cut to fit, as no job's environment can hold more."""
TOPO = {"name": "slm",
        "nodes": {"s1": {"kind": "switch", "host": "a"}, "s2": {"kind": "switch", "host": "b"},
                  "w0": {"kind": "worker"}, "w1": {"kind": "worker"}},
        "links": [{"endpoints": ["w0", "s1"]}, {"endpoints": ["w1", "s2"]}, {"endpoints": ["s1", "s2"]}]}
SCONTROL = "#!/bin/sh\necho 'scontrol: error: no controller' >&2\necho 'scontrol: fatal: giving up' >&2\nexit 1\n"
WRAP = ("import resource, subprocess, sys\n"
        "def cap():\n"
        "    resource.setrlimit(resource.RLIMIT_AS, (int(sys.argv[1]), int(sys.argv[1])))\n"
        "try:\n"
        "    rc = subprocess.run(sys.argv[3:], timeout=float(sys.argv[2]), preexec_fn=cap).returncode\n"
        "except subprocess.TimeoutExpired:\n"
        "    rc = 124\n"
        "sys.stdout.flush()\n"
        "print('\\nMAXRSS_KB', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
        "sys.exit(rc)\n")
"""Runs the command as its only child, under the address-space limit, and prints that child's
peak RSS (the test process's own children's figure would be the largest of every earlier test's)."""

CHECKS = settings(max_examples=7, deadline=None, database=None,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@pytest.fixture(scope="module")
def place(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("slurm-cli")
    (d / "t.yaml").write_text(json.dumps(TOPO))
    (d / "bin").mkdir()
    (d / "bin" / "scontrol").write_text(SCONTROL)
    (d / "bin" / "scontrol").chmod(0o755)
    return d


def _env(place: Path, slurm: dict[str, str]) -> dict[str, str]:
    env = {"PATH": str(place / "bin"), "HOME": str(place), "LANG": "C.UTF-8", "PYTHONIOENCODING": "utf-8",
           "TESTBED_STATE_DIR": str(place / "no-state"), "PYTHONDONTWRITEBYTECODE": "1"}
    if os.environ.get("PYTHONPATH"):
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    return {**env, **{k: v for k, v in slurm.items() if v and "\x00" not in v}}


def _cli(place: Path, args: list[str], slurm: dict[str, str]) -> tuple[int, list[str], float]:
    """(exit status, stderr's lines, peak RSS in MB) of ``testbed ARGS`` with ``slurm`` set."""
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-c", WRAP, str(LIMIT_AS), str(TIMEOUT_S), sys.executable, "-m", "testbed.cli",
                        *args], capture_output=True, env=_env(place, slurm), cwd=place, stdin=subprocess.DEVNULL,
                       timeout=TIMEOUT_S + 30)
    out, err = p.stdout.decode(errors="replace"), p.stderr.decode(errors="replace")
    assert p.returncode != 124, f"testbed {args[0]} ran past {TIMEOUT_S} s with {slurm}"
    assert "Traceback" not in err + out, f"testbed {args[0]} with {slurm}:\n{err[-3000:]}"
    assert time.monotonic() - t0 < TIMEOUT_S
    return p.returncode, err.splitlines(), int(out.rpartition("MAXRSS_KB ")[2]) / 1024


def _fit(name: str, value: str) -> str:
    """``value`` as an environment can hold it: at most MAX_ARG_STRLEN bytes with its name."""
    return os.fsdecode(os.fsencode(value)[:MAX_ARG_STRLEN - len(name) - 2])


def _refused(place: Path, args: list[str], slurm: dict[str, str], names: list[str]) -> None:
    """The command fails in one line (and a hint), naming the first of ``names`` (the
    variables the command reads, in its order) whose value is wrong."""
    slurm = {k: _fit(k, v) for k, v in slurm.items()}
    code, lines, rss = _cli(place, args, slurm)
    assert rss < MAX_RSS_MB, (rss, slurm)
    assert code == 1 and lines and lines[0].startswith("error: "), (code, lines[:3], slurm)
    assert len(lines) == 1 or (len(lines) == 2 and lines[1].startswith("  hint: ")), lines[:4]
    checks = {"SLURM_JOB_ID": valid_job_id, "SLURMD_NODENAME": valid_node_name}
    wrong = next((n for n in names if slurm.get(n) and "\x00" not in slurm[n] and not checks[n](slurm[n])), None)
    if wrong is not None:
        assert f"{wrong}=" in lines[0], (wrong, lines[0])
    assert not (place / "no-state").exists()


@CHECKS
@given(job=job_ids, nodelist=node_lists, node=node_names)
@example(job="7", nodelist="x[0-65535]y[0-65535]", node="")
@example(job="²", nodelist="n[1-2]", node="")
@example(job="7", nodelist="n[1-2]", node="gpu[08]")
@example(job="7", nodelist="n[1-2]", node="")
def test_validate_hosts_slurm_refuses_any_hostile_value_in_one_line(place, job, nodelist, node):
    _refused(place, ["validate", str(place / "t.yaml"), "--hosts", "slurm"],
             {"SLURM_JOB_ID": job, "SLURM_JOB_NODELIST": nodelist, "SLURMD_NODENAME": node}, ["SLURM_JOB_ID"])


@CHECKS
@given(job=job_ids, nodelist=node_lists, node=node_names)
@example(job="7", nodelist="n[0-99999]z[0-99999]", node="")
@example(job="4²", nodelist="n[1-2]", node="n1")
def test_up_hosts_slurm_refuses_any_hostile_value_in_one_line_before_making_anything(place, job, nodelist, node):
    _refused(place, ["up", str(place / "t.yaml"), "--hosts", "slurm"],
             {"SLURM_JOB_ID": job, "SLURM_JOB_NODELIST": nodelist, "SLURMD_NODENAME": node}, ["SLURM_JOB_ID"])


@CHECKS
@given(job=job_ids, node=node_names, nodelist=st.one_of(st.just(""), node_lists))
@example(job="²", node="n1", nodelist="")
@example(job="42", node="\x1b]0;x\x07gpu", nodelist="")
def test_doctor_refuses_a_hostile_job_or_node_in_one_line(place, job, node, nodelist):
    job, node = ("" if "\x00" in v else v for v in (job, node))  # an environment cannot hold NUL: unset
    assume(not (valid_job_id(job) or not job) or not (valid_node_name(node) or not node))  # else it checks the machine
    _refused(place, ["doctor"], {"SLURM_JOB_ID": job, "SLURMD_NODENAME": node, "SLURM_JOB_NODELIST": nodelist},
             ["SLURMD_NODENAME", "SLURM_JOB_ID"])
