"""Hostile values of Slurm's variables (issue 56, class 4), as hypothesis strategies shared by
tests/unit/test_slurm_env.py (the parsers) and tests/unit/test_slurm_env_cli.py (the CLI),
and the plain rules a value must follow, written here independently of testbed's code.

Only hypothesis is imported: the CLI test runs against older trees too (PYTHONPATH)."""

from __future__ import annotations

import os
import re

from hypothesis import strategies as st

MAX_JOB_ID = 2**32 - 1
MAX_NODES = 65536
ASCII_DIGITS = "0123456789"

other_digits = st.characters(categories=["Nd", "No"], exclude_characters=ASCII_DIGITS)
"""A digit to ``str.isdigit`` that is no ASCII digit: superscripts (``²``, which ``int``
refuses), digits of other scripts (``٣``, which ``int`` reads as 3), fullwidth ``７``."""
from_environment = st.binary(max_size=40).map(os.fsdecode)
"""Bytes as Python reads them from the environment: what is no UTF-8 becomes lone surrogates."""
huge_numbers = st.one_of(st.integers(0, 10**60).map(str), st.integers(1, 6000).map(lambda n: "9" * n))
very_long = st.integers(1000, 200_000).map(lambda n: "7" * n)

job_ids = st.one_of(
    st.text(max_size=30),
    st.text(st.sampled_from(ASCII_DIGITS), min_size=1, max_size=12),
    st.text(st.one_of(other_digits, st.sampled_from(ASCII_DIGITS)), min_size=1, max_size=12),
    huge_numbers, very_long, from_environment,
    st.sampled_from(["²", "4²", "٣", "７", "0", "4294967295", "4294967296", "-1", " 7", "7\n", "+7", "1_000", "0x10",
                     "7;x", "\x1b[31m7"]),
)

node_names = st.one_of(
    st.text(max_size=30),
    st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,70}", fullmatch=True),
    st.text(st.sampled_from("aZ09._-[],/ \n\x1b"), max_size=20),
    st.integers(60, 200_000).map(lambda n: "n" * n), from_environment,
    st.sampled_from(["gpu[08]", "-x", "n/1", "n²", "gpu08\n", "\x1b]0;x\x07"]),
)

_numbers = st.one_of(st.integers(0, 70_000).map(str), st.integers(0, 10**11).map(str),
                     st.integers(0, 999).map(lambda i: f"{i:05d}"),
                     st.text(st.one_of(other_digits, st.sampled_from(ASCII_DIGITS)), min_size=1, max_size=3))
_ranges = st.one_of(_numbers, st.tuples(_numbers, _numbers).map("-".join))
_groups = st.lists(_ranges, min_size=1, max_size=4).map(lambda rs: "[" + ",".join(rs) + "]")
_literals = st.one_of(st.from_regex(r"[a-z][a-z0-9-]{0,3}", fullmatch=True), st.text(max_size=3))
_items = st.lists(st.one_of(_literals, _groups), min_size=1, max_size=5).map("".join)
_nested = st.recursive(st.sampled_from(["n1", "1-2", ""]), lambda inner: inner.map(lambda s: f"n[{s}]"), max_leaves=6)
products = st.lists(st.integers(1, 70_000), min_size=2, max_size=6).map(
    lambda sizes: "x" + "y".join(f"[0-{n - 1}]" for n in sizes))
"""``x[0-A]y[0-B]...``: as many nodes as the product of the sizes, often far above MAX_NODES."""

node_lists = st.one_of(
    st.lists(_items, min_size=1, max_size=4).map(",".join),
    products, _nested, st.text(max_size=40), from_environment,
    st.text(st.sampled_from("n1[]-,"), max_size=40),
    st.integers(1, 70_000).map(lambda n: ",".join(["n"] * n)),
    st.integers(1000, 200_000).map(lambda n: "n" * n),
    st.sampled_from(["x[0-65535]y[0-65535]", "n[0-999999999]", "n[1-", "[[1]]", "n[²]", "n[٣]", "a,,b", ",", "n[]",
                     "n[3-1]", "n[1-2]" * 40]),
)


def valid_job_id(value: str) -> bool:
    """What Slurm sets: ASCII digits, a 32-bit job id above 0."""
    return re.fullmatch(r"[0-9]{1,10}", value) is not None and 1 <= int(value) <= MAX_JOB_ID


def valid_node_name(value: str) -> bool:
    return re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", value) is not None
