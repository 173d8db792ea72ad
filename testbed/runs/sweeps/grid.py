"""`testbed sweep --param KEY=V1,V2 ...`: a parameter grid over runs.

Each ``--param`` names one argument of the code that runs (``lr=0.1,0.05`` becomes
``--lr 0.1`` for one run and ``--lr 0.05`` for another) and the sweep runs the cartesian
product of all of them. For the built-in trainer a scheme's own parameter (``hook``,
``topk-ratio``, ...) is passed to the schemes that have it only, so an ``allreduce``
baseline beside ``hook`` runs once, not once per hook. The grid point each run used is kept
in its summary (``params``) and ``report`` groups runs by it.
"""

from __future__ import annotations

import itertools
import re

from testbed.common.errors import TestbedError

KEY = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,63}")
MAX_VALUES = 64
MAX_POINTS = 1024


def parse(specs: list[str]) -> dict[str, list[str]]:
    """``["lr=0.1,0.05", "batch=32"]`` -> {"lr": ["0.1", "0.05"], "batch": ["32"]}, checked."""
    grid: dict[str, list[str]] = {}
    for spec in specs:
        key, eq, values = spec.partition("=")
        if not eq or not KEY.fullmatch(key):
            raise TestbedError(f"--param {spec!r} is not KEY=VALUE[,VALUE...]",
                               "e.g. --param lr=0.1,0.05 (a key of letters, digits, - and _)")
        vals = [v.strip() for v in values.split(",")]
        if not all(vals):
            raise TestbedError(f"--param {spec!r} has an empty value", "e.g. --param lr=0.1,0.05")
        if len(vals) > MAX_VALUES:
            raise TestbedError(f"--param {key}: give at most {MAX_VALUES} values, got {len(vals)}")
        if len(set(vals)) != len(vals):
            twice = sorted({v for v in vals if vals.count(v) > 1})
            raise TestbedError(f"--param {key}: {', '.join(twice)} given twice", "list each value once")
        if norm(key) in {norm(k) for k in grid}:
            raise TestbedError(f"--param {key} is given twice", "list its values once: --param KEY=V1,V2")
        grid[key] = vals
    if (size := size_of(grid)) > MAX_POINTS:
        raise TestbedError(f"--param: the grid has {size} points, more than {MAX_POINTS}", "sweep fewer values")
    return grid


def size_of(grid: dict[str, list[str]]) -> int:
    """The grid's number of points (its values' counts multiplied)."""
    size = 1
    for vals in grid.values():
        size *= len(vals)
    return size


def points(grid: dict[str, list[str]]) -> list[dict[str, str]]:
    """Every combination of the grid's values, in the order given ([{}] for no grid)."""
    keys = list(grid)
    return [dict(zip(keys, combo)) for combo in itertools.product(*(grid[k] for k in keys))]


def for_scheme(grid: dict[str, list[str]], scheme: str | None) -> list[dict[str, str]]:
    """The grid points one scheme runs: every point for the user's code (``scheme`` None);
    for a built-in scheme, the keys that are other schemes' parameters are left out and the
    points that then coincide run once."""
    if scheme is None:
        return points(grid)
    from workloads.schemes import parameters, parse_variant

    name = parse_variant(scheme)[0].name
    foreign = {p.name for p in parameters() if name not in p.schemes}
    mine = {k: v for k, v in grid.items() if norm(k) not in foreign}
    return points(mine)


def argv(point: dict[str, str], builtin: bool = False) -> list[str]:
    """A grid point as command-line arguments: ``{"lr": "0.1"}`` -> ``["--lr", "0.1"]``. For the
    built-in trainer (``builtin``) a switch's value picks its flag: ``{"ternary": "off"}`` ->
    ``["--no-ternary"]`` (any other value is passed on, and the trainer refuses it)."""
    from workloads.schemes import parameters

    switches = {p.name: p for p in parameters() if p.type is bool} if builtin else {}
    out = []
    for k, v in point.items():
        flag = switches[norm(k)].switch_flag(v) if norm(k) in switches else None
        out += [flag] if flag else [f"--{k}", v]
    return out


def slug(point: dict[str, str]) -> str:
    """A grid point as a run-id part: ``{"lr": "0.1", "hook": "m:f"}`` -> ``lr0.1-hookm_f``."""
    return "-".join(re.sub(r"[^A-Za-z0-9_.]", "_", f"{k}{v}")[:40] for k, v in point.items())


def norm(key: str) -> str:
    """A key as the trainer names the parameter (``topk-ratio`` -> ``topk_ratio``)."""
    return key.replace("-", "_")
