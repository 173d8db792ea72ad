"""Slurm's variables are input (issue 56, class 4): for any value of SLURM_JOB_ID,
SLURM_JOB_NODELIST and SLURMD_NODENAME, the parsers (testbed.common.slurmenv, hostlist) and
every reader of them give what Slurm means by it or a one-line StateError naming the
variable, in bounded time and memory: never another exception, and a node list's size is
known before any list is built. The CLI over the same values: test_slurm_env_cli.py."""

from __future__ import annotations

import itertools
import os
import re
import time
import tracemalloc
from unittest import mock

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from testbed.common import hostbase, hostlist, slurmenv
from testbed.common.errors import StateError, TopologyError
from testbed.engine import doctor
from testbed.hosts.slurm import job as slurmjob, step as slurmstep
from testbed.model.hosts import Host, parse_hosts
from tests.hostile_slurm import (MAX_JOB_ID, MAX_NODES, job_ids, node_lists, node_names, products, valid_job_id,
                                 valid_node_name)

FAST = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
MAX_PEAK_MB = 32  # 65536 names of up to 64 characters are about 8 MB
MAX_SECONDS = 10.0  # a bounded parse takes milliseconds; an unbounded one of these values, minutes or all memory


def _one_line(e: StateError, name: str) -> None:
    """The error names the variable first, quotes no control character, fits on a line."""
    assert e.message.startswith(f"{name}=") and "\n" not in e.message and len(e.message) < 600, e.message
    assert e.message.isprintable() and e.hint and "\n" not in e.hint


@FAST
@given(value=job_ids)
@example(value="²")
@example(value="9" * 5000)
def test_a_job_id_is_slurms_or_a_one_line_error(value):
    try:
        got = slurmenv.job_id({"SLURM_JOB_ID": value})
    except StateError as e:
        assert value and not valid_job_id(value)
        _one_line(e, "SLURM_JOB_ID")
    else:
        assert got == (int(value) if value else None) and (not value or valid_job_id(value))


@FAST
@given(value=node_names)
@example(value="gpu[08]")
def test_a_node_name_is_slurms_or_a_one_line_error(value):
    try:
        got = slurmenv.node_name({"SLURMD_NODENAME": value})
    except StateError as e:
        assert value and not valid_node_name(value)
        _one_line(e, "SLURMD_NODENAME")
    else:
        assert got == (value or None) and (not value or valid_node_name(value))


def _expand(value: str) -> tuple[list[str] | StateError, float, float]:
    """(the nodes or the error, peak MB allocated, seconds) of ``SLURM_JOB_NODELIST=value``."""
    tracemalloc.start()
    t0 = time.monotonic()
    try:
        got: list[str] | StateError = slurmenv.job_nodes({"SLURM_JOB_NODELIST": value})
    except StateError as e:
        got = e
    finally:
        seconds = time.monotonic() - t0
        peak = tracemalloc.get_traced_memory()[1] / 2**20
        tracemalloc.stop()
    return got, peak, seconds


@pytest.mark.slow  # the quick pass under 2 minutes; the suite runs it
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(value=node_lists)
@example(value="x[0-65535]y[0-65535]")
@example(value="n[²]")
@example(value="[[1]]")
def test_a_node_list_is_nodes_or_a_one_line_error_in_bounded_memory_and_time(value):
    got, peak, seconds = _expand(value)
    assert peak < MAX_PEAK_MB and seconds < MAX_SECONDS, (value[:80], peak, seconds)
    if isinstance(got, StateError):
        _one_line(got, "SLURM_JOB_NODELIST")
    else:
        assert len(got) <= MAX_NODES and all(valid_node_name(n) for n in got)


@settings(max_examples=100, deadline=None)
@given(value=products)
@example(value="x[0-65535]y[0-65535]")
def test_a_product_of_ranges_is_counted_before_it_is_built(value):
    """``x[0-A]y[0-B]...``: refused when the product passes MAX_NODES, with little memory
    (nothing of the product was made); else exactly the product."""
    sizes = [int(hi) + 1 for hi in re.findall(r"\[0-([0-9]+)\]", value)]
    total = 1
    for s in sizes:
        total *= s
    got, peak, _ = _expand(value)
    if total > MAX_NODES:
        assert isinstance(got, StateError) and f"more than {MAX_NODES} nodes" in got.message
        assert peak < 1, peak
    else:
        assert not isinstance(got, StateError) and len(got) == total


_ranges = st.tuples(st.integers(0, 120), st.integers(0, 3), st.integers(1, 3))
_items = st.tuples(st.from_regex(r"[a-z]{1,3}", fullmatch=True),
                   st.lists(st.tuples(st.lists(_ranges, min_size=1, max_size=3),
                                      st.from_regex(r"[a-z-]{0,2}", fullmatch=True)), max_size=3))


def _reference(items) -> tuple[str, list[str]]:
    """A node list made of ``items`` and its expansion as ``scontrol show hostnames`` gives
    it: each group's ranges in order, zero padded to the start's width, groups multiplied
    out left to right."""
    texts, names = [], []
    for prefix, groups in items:
        text, choices = prefix, []
        for ranges, after in groups:
            text += "[" + ",".join(f"{lo:0{w}d}" + (f"-{lo + n:0{w}d}" if n else "") for lo, n, w in ranges) + "]" + after
            choices.append([f"{i:0{w}d}{after}" for lo, n, w in ranges for i in range(lo, lo + n + 1)])
        texts.append(text)
        names += [prefix + "".join(c) for c in itertools.product(*choices)]
    return ",".join(texts), names


@FAST
@given(items=st.lists(_items, min_size=1, max_size=3))
def test_a_valid_node_list_expands_as_scontrol_does(items):
    text, names = _reference(items)
    assert hostlist.expand(text) == names


@FAST
@given(job=job_ids, node=node_names, nodelist=node_lists)
def test_every_reader_of_the_variables_refuses_in_one_line_or_takes_only_valid_values(job, node, nodelist):
    """hostbase (the folder of a node's namespaces: a bad value counts as unset), doctor's
    report, a step's argv and the guard of this node's part, each with the same environment."""
    given_env = {"SLURM_JOB_ID": job, "SLURMD_NODENAME": node, "SLURM_JOB_NODELIST": nodelist}
    env = {k: v for k, v in given_env.items() if v and "\x00" not in v}  # what an environment can hold
    ok_job, has_job = valid_job_id(env.get("SLURM_JOB_ID", "1")), "SLURM_JOB_ID" in env
    ok_node, has_node = valid_node_name(env.get("SLURMD_NODENAME", "n")), "SLURMD_NODENAME" in env
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    started: list[list[str]] = []
    with mock.patch.dict(os.environ, {**clean, **env}, clear=True), \
            mock.patch.object(slurmstep, "start", lambda argv, **kw: started.append(argv)), \
            mock.patch.object(slurmjob.os, "geteuid", lambda: 0):
        base = hostbase.job_base(on_node=True)
        assert (base is None) if not (has_job and ok_job) else base.name.endswith(f"-job{int(job)}")
        assert len(hostbase.node_name()) <= hostbase.MAX_NAME
        try:
            place = doctor.where()
        except StateError as e:
            assert not (ok_job and ok_node)
            _one_line(e, "SLURMD_NODENAME" if not ok_node else "SLURM_JOB_ID")
        else:
            assert ok_job and ok_node and place["slurm_job"] == (int(job) if has_job else None)
        try:
            argv = slurmstep.step_argv(Host("h", "192.0.2.1", "192.0.2.1", slurm="n1"), ["true"])
        except StateError as e:
            assert not (has_job and ok_job), e
        else:
            assert has_job and ok_job and f"--jobid={int(job)}" in argv
        assert slurmjob.guard_here("slm") == bool(started) == (has_job and ok_job and has_node and ok_node)


def test_a_hosts_entrys_job_is_a_32_bit_id():
    ok = {"name": "h1", "address": "192.0.2.1", "slurm": "gpu1"}
    assert parse_hosts([{**ok, "slurm_job": MAX_JOB_ID}])[0].slurm_job == MAX_JOB_ID
    with pytest.raises(TopologyError, match="slurm_job"):
        parse_hosts([{**ok, "slurm_job": MAX_JOB_ID + 1}])
