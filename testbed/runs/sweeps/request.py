"""A sweep's request as a file: what ``sweep --slurm`` writes into the sweep's directory
(``slurm/request.json``) and each element of its job array reads back on its node.

The file is input like any other (a directory may be planted, a file edited): it is read
bounded, every field is checked for its type and range, and the workload's options are
parsed again (:meth:`SweepRequest.check`), each failure one line naming the field. Paths
are absolute, so an element finds them whatever its working directory. The topology travels
as its parsed document (the element renames it and may give it the job's nodes as hosts).

``key`` is what makes two submissions "the same sweep": the request without ``out``.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import fields
from pathlib import Path
from typing import Any

from testbed.common.errors import TestbedError
from testbed.common.files import read_json, write_json
from testbed.model.units import Rate
from testbed.runs.sweeps import grid
from testbed.runs.request import UserCode
from testbed.runs.sweeps.sweep import Pretraining, SweepRequest

VERSION = 1
MAX_ITEMS = 1000
"""Entries of a list field at most."""
MAX_RUNS = 10_000
"""Runs of a sweep at most (Slurm's default MaxArraySize is 1001)."""
NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")
"""A model's or data set's name (a part of the checkpoint's file name)."""


def to_dict(req: SweepRequest, topology: dict) -> dict:
    """``req`` (its paths absolute) with the topology's document."""
    return {
        "version": VERSION, "schemes": list(req.schemes), "bws": [str(b) for b in req.bws],
        "workload_args": list(req.workload_args), "repeats": req.repeats, "timeout": req.timeout,
        "init": _abs(req.init), "exporter": req.exporter, "tensorboard": req.tensorboard,
        "params": {k: list(v) for k, v in req.params.items()}, "dilation": req.dilation,
        "out": str(req.out.resolve()), "topology": topology,
        "pretrain": None if req.pretrain is None else {
            **{f.name: getattr(req.pretrain, f.name) for f in fields(Pretraining)},
            "data_dir": _abs(req.pretrain.data_dir)},
        "code": None if req.code is None else {"kind": req.code.kind, "target": req.code.target,
                                                "path": str(req.code.path)},
    }


def key(doc: dict) -> str:
    """The sweep's identity: a digest of its request without ``out`` (where it lands)."""
    same = {k: v for k, v in doc.items() if k != "out"}
    return hashlib.sha256(json.dumps(same, sort_keys=True).encode()).hexdigest()[:16]


def write(path: Path, req: SweepRequest, topology: dict) -> dict:
    doc = to_dict(req, topology)
    write_json(path, doc)
    return doc


def read(path: Path) -> tuple[SweepRequest, dict]:
    """The request in ``path`` and the topology's document; TestbedError naming the field."""
    try:
        doc = read_json(path, "json", "sweep request")
    except ValueError:
        raise TestbedError(f"{path} is not JSON", "it is written by `testbed sweep --slurm`; submit again") from None
    req = from_dict(doc, str(path))
    return req, doc["topology"]


def from_dict(doc: Any, where: str) -> SweepRequest:
    f = _Fields(doc, where)
    if f.get("version", int) != VERSION:
        raise TestbedError(f"{where}: version {doc.get('version')!r} is not {VERSION}",
                           "it was written by another testbed version; submit the sweep again with this one")
    f.get("topology", dict)
    req = SweepRequest(
        schemes=f.strings("schemes"), bws=[_rate(b, where) for b in f.strings("bws")],
        workload_args=f.strings("workload_args", empty=True), repeats=f.number("repeats", int, 1, 1000),
        timeout=f.number("timeout", float, 1e-3, 1e7), init=f.path("init"),
        exporter=f.get("exporter", bool), tensorboard=f.get("tensorboard", bool),
        params=f.grid("params"), dilation=f.number("dilation", float, 1.0, 1e4), out=f.required_path("out"),
        pretrain=f.pretraining("pretrain"), code=f.code("code"))
    runs = len(req.bws) * req.repeats * len(req.schemes) * grid.size_of(req.params)
    if runs > MAX_RUNS:
        raise TestbedError(f"{where}: {runs} runs, more than the {MAX_RUNS} a sweep may have", "submit the sweep again")
    req.check()  # the workload's options, parsed as the CLI parses them
    return req


class _Fields:
    """The fields of a request document, each checked for its type (TestbedError naming it)."""

    def __init__(self, doc: Any, where: str) -> None:
        if not isinstance(doc, dict):
            raise TestbedError(f"{where}: not a JSON object", "submit the sweep again")
        self.doc, self.where = doc, where

    def bad(self, name: str, want: str) -> TestbedError:
        return TestbedError(f"{self.where}: field {name!r} is not {want}", "submit the sweep again")

    def get(self, name: str, kind: type, optional: bool = False) -> Any:
        value = self.doc.get(name)
        if value is None and optional:
            return None
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise self.bad(name, f"a {kind.__name__}")
        if isinstance(value, str) and ("\0" in value or len(value) > 4096):
            raise self.bad(name, "a string without NUL of at most 4096 characters")
        return value

    def number(self, name: str, kind: type, low: float, high: float) -> Any:
        value = self.doc.get(name)
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and low <= value <= high
        if not ok or (kind is int and not isinstance(value, int)):
            raise self.bad(name, f"a {kind.__name__} from {low:g} to {high:g}")
        return kind(value)

    def strings(self, name: str, empty: bool = False) -> list[str]:
        value = self.doc.get(name)
        if (not isinstance(value, list) or not (value or empty) or len(value) > MAX_ITEMS
                or not all(isinstance(v, str) and len(v) <= 4096 and "\0" not in v for v in value)):
            raise self.bad(name, "a list of strings")
        return value

    def path(self, name: str, required: bool = False) -> Path | None:
        value = self.get(name, str, optional=not required)
        if value is not None and not Path(value).is_absolute():
            raise self.bad(name, "an absolute path")
        return None if value is None else Path(value)

    def name(self, name: str) -> str:
        value = self.get(name, str)
        if not NAME.fullmatch(value):
            raise self.bad(name, "a name of letters, digits, '_', '.' and '-'")
        return value

    def required_path(self, name: str) -> Path:
        value = self.path(name, required=True)
        assert value is not None  # (path refuses a missing one when required)
        return value

    def grid(self, name: str) -> dict[str, list[str]]:
        value = self.get(name, dict)
        if len(value) > 64 or not all(grid.KEY.fullmatch(k) and isinstance(v, list) and len(v) <= grid.MAX_VALUES
                                      and all(isinstance(x, str) and "\0" not in x for x in v)
                                      for k, v in value.items()) or grid.size_of(value) > grid.MAX_POINTS:
            raise self.bad(name, "a grid (names to lists of strings, as --param makes)")
        return value

    def pretraining(self, name: str) -> Pretraining | None:
        value = self.get(name, dict, optional=True)
        if value is None:
            return None
        inner = _Fields(value, f"{self.where}: {name}")
        return Pretraining(model=inner.name("model"), dataset=inner.name("dataset"),
                           epochs=inner.number("epochs", float, 0, 1e6),
                           width=None if value.get("width") is None else inner.number("width", float, 0, 1e3),
                           depth=inner.get("depth", int, optional=True), data_dir=inner.path("data_dir"),
                           seed=inner.number("seed", int, 0, 2**31))

    def code(self, name: str) -> UserCode | None:
        value = self.get(name, dict, optional=True)
        if value is None:
            return None
        inner = _Fields(value, f"{self.where}: {name}")
        kind = inner.get("kind", str)
        if kind not in ("script", "module"):
            raise inner.bad("kind", "script or module")
        return UserCode(kind, inner.get("target", str), inner.required_path("path"))


def _rate(text: str, where: str) -> Rate:
    try:
        return Rate.parse(text)
    except (TypeError, ValueError) as e:
        raise TestbedError(f"{where}: bws: {text!r} is not a rate ({e})", "submit the sweep again") from None


def _abs(path: Path | None) -> str | None:
    return None if path is None else str(Path(path).resolve())
