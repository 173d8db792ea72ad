"""Slurm's variables, read as input like any other: each is checked, within bounds, before
it is used, and a bad one is refused in one line naming the variable, its value (cut, and
written as Python writes a string, so nothing in it reaches the terminal as is) and what it
must be.

testbed reads three: ``SLURM_JOB_ID`` (the job this process runs in: ASCII digits, a 32-bit
id), ``SLURM_JOB_NODELIST`` (the job's nodes, in Slurm's hostlist syntax, expanded within
the bounds of :mod:`testbed.common.hostlist`) and ``SLURMD_NODENAME`` (this node's name, in
a job's steps and batch script: ``NODE_RE``). An unset or empty variable is None (outside a
job); where only a choice depends on one (which folder holds a node's namespaces), the
caller may take a bad value as unset (:func:`or_none`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import TypeVar

from testbed.common import hostlist
from testbed.common.digits import ascii_int
from testbed.common.errors import StateError, shown

JOB_ID, NODELIST, NODENAME = "SLURM_JOB_ID", "SLURM_JOB_NODELIST", "SLURMD_NODENAME"
MAX_JOB_ID = 2**32 - 1
"""Slurm's job ids are 32-bit."""
JOB_ID_DIGITS = len(str(MAX_JOB_ID))
NODE_RE = hostlist.NODE_RE
HINT = "Slurm sets it in a job's steps and batch script; unset it outside one, or run inside an allocation (salloc, sbatch)"

T = TypeVar("T")
Env = Mapping[str, str]


def refused(name: str, value: str, what: str) -> StateError:
    """The one-line error about variable ``name`` set to ``value``, which is not ``what``."""
    return StateError(f"{name}={shown(value)} is not {what}", HINT)


def job_id(env: Env | None = None) -> int | None:
    """This process's job, ``SLURM_JOB_ID``; None when unset or empty."""
    value = (os.environ if env is None else env).get(JOB_ID)
    if not value:
        return None
    job = ascii_int(value, JOB_ID_DIGITS)
    if job is None or not 1 <= job <= MAX_JOB_ID:
        raise refused(JOB_ID, value, f"a job id (1 to {JOB_ID_DIGITS} ASCII digits, 1 to {MAX_JOB_ID})")
    return job


def node_name(env: Env | None = None) -> str | None:
    """This node's name, ``SLURMD_NODENAME``; None when unset or empty."""
    value = (os.environ if env is None else env).get(NODENAME)
    if not value:
        return None
    if not NODE_RE.fullmatch(value):
        raise refused(NODENAME, value, f"a node name (1 to {hostlist.MAX_NAME} of A-Z a-z 0-9 . _ -, "
                      "starting with a letter or digit)")
    return value


def job_nodes(env: Env | None = None) -> list[str]:
    """The job's nodes, ``SLURM_JOB_NODELIST`` expanded (:func:`testbed.common.hostlist.expand`);
    empty when unset or empty."""
    value = (os.environ if env is None else env).get(NODELIST)
    if not value:
        return []
    try:
        return hostlist.expand(value)
    except ValueError as e:
        raise refused(NODELIST, value, f"a node list testbed expands: {e}") from None


def or_none(read: Callable[[Env | None], T | None], env: Env | None = None) -> T | None:
    """``read(env)``, None where the variable it reads is set to a bad value."""
    try:
        return read(env)
    except StateError:
        return None
