"""Slurm's hostlist syntax (``SLURM_JOB_NODELIST``: ``n[1-3,5],m7``, ``r[1-2]-n[01-02]``)
expanded into node names as ``scontrol show hostnames`` does, within bounds checked before
any name is made.

A node list is input like any other: ``x[0-65535]y[0-65535]`` names 2**32 nodes, and
multiplying it out would exhaust memory before a count made afterwards could refuse it. So
the list is first parsed (in one pass, at most ``MAX_TEXT`` characters) into items of
literals and bracket groups of ranges (``LO-HI`` or ``N``, ASCII digits, at most
``MAX_NUMBER_DIGITS`` each); then, as numbers, each item's shortest name (at most
``MAX_NAME`` characters) and its count of names (the product of its groups' sizes, each
the sum of its ranges' ``HI - LO + 1``), and the list's total, at most ``MAX_NODES``. Only
then are the names made, each checked against ``NODE_RE``.
"""

from __future__ import annotations

import re
from typing import Union

from testbed.common.errors import shown

MAX_TEXT = 128 * 1024
"""Characters of a node list (Linux passes no longer environment string, MAX_ARG_STRLEN)."""
MAX_NODES = 65536
"""Node names a list may expand to."""
MAX_NUMBER_DIGITS = 9
"""Digits of a range's bound (``gpu[000000001-000000002]``)."""
MAX_NAME = 64
NODE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
"""A Slurm node name as testbed takes it (what it passes to ``srun --nodelist``)."""

_TOKEN = re.compile(r"\[[^\[\]]*\]|[^\[\],]+|[\s\S]")
_RANGE = re.compile(rf"([0-9]{{1,{MAX_NUMBER_DIGITS}}})(?:-([0-9]{{1,{MAX_NUMBER_DIGITS}}}))?")

Range = tuple[int, int, int]
"""(lo, hi, width): the numbers lo..hi, each written with at least width digits."""
Part = Union[str, list[Range]]
"""A literal, or a bracket group's ranges."""


def expand(text: str) -> list[str]:
    """``text``'s node names in order (zero padding kept, each bracket group multiplied out
    left to right); ValueError, saying which bound or rule it breaks, on a list that is
    malformed, too long, or names too many nodes or a name that is no node name."""
    items = parse(text)
    total = 0
    for parts in items:
        shortest = sum(len(p) if isinstance(p, str) else min(max(w, len(str(lo))) for lo, _, w in p) for p in parts)
        if shortest > MAX_NAME:
            raise ValueError(f"it names a node of more than {MAX_NAME} characters")
        total += count(parts)
        if total > MAX_NODES:
            raise ValueError(f"it names more than {MAX_NODES} nodes (the most testbed expands)")
    out = [name for parts in items for name in _names(parts)]
    bad = next((n for n in out if not NODE_RE.fullmatch(n)), None)
    if bad is not None:
        raise ValueError(f"{shown(bad)} is not a node name (1 to {MAX_NAME} of A-Z a-z 0-9 . _ -, "
                         "starting with a letter or digit)")
    return out


def parse(text: str) -> list[list[Part]]:
    """The items of ``text`` (split at commas outside brackets), each a list of literals and
    bracket groups; ValueError on a list longer than ``MAX_TEXT``, an empty item, a bracket
    unbalanced or nested, or a malformed range."""
    if len(text) > MAX_TEXT:
        raise ValueError(f"it is {len(text)} characters long (at most {MAX_TEXT})")
    items: list[list[Part]] = []
    parts: list[Part] = []
    for m in _TOKEN.finditer(text.strip()):
        token = m.group()
        if token == ",":
            items.append(parts)
            parts = []
        elif token.startswith("[") and len(token) > 1:
            parts.append(_group(token[1:-1]))
        elif token in ("[", "]"):
            raise ValueError(f"a bracket is unbalanced or nested (at character {m.start() + 1})")
        else:
            parts.append(token)
    items.append(parts)
    if any(not p for p in items):
        raise ValueError("it has an empty name (two commas in a row, or one at an end)")
    return items


def _group(body: str) -> list[Range]:
    """A bracket group's ranges (``1-3,5``, ``08-11``)."""
    out: list[Range] = []
    for r in body.split(","):
        m = _RANGE.fullmatch(r.strip())
        if m is None:
            raise ValueError(f"{shown(r)} is not a range (N or LO-HI, 1 to {MAX_NUMBER_DIGITS} ASCII digits each)")
        lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
        if hi < lo:
            raise ValueError(f"the range {shown(r)} ends below its start")
        out.append((lo, hi, len(m.group(1))))
    return out


def count(parts: list[Part]) -> int:
    """How many names an item makes: the product of its groups' sizes, computed without
    making them (it stops once past ``MAX_NODES``, so a product of many large groups stays
    a small number)."""
    n = 1
    for p in parts:
        if not isinstance(p, str):
            n *= sum(hi - lo + 1 for lo, hi, _ in p)
            if n > MAX_NODES:
                break
    return n


def _names(parts: list[Part]) -> list[str]:
    names = [""]
    for p in parts:
        tails = [p] if isinstance(p, str) else [str(i).zfill(w) for lo, hi, w in p for i in range(lo, hi + 1)]
        names = [n + t for n in names for t in tails]
    return names
