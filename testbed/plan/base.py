"""What every action is: a frozen dataclass that applies and undoes itself, its ledger form,
the registry that reads ledger entries back, and the contexts actions run in.

Ledger entries are read as untrusted input: :func:`from_dict` accepts only registered
actions, known fields and plain JSON types, and names what is wrong otherwise. The actions
themselves are in :mod:`testbed.plan.actions` (kernel objects, host processes) and with
what they make (a backend's, other hosts' shares).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from typing import Any, ClassVar

from testbed.common.errors import StateError, TestbedError
from testbed.model.topology import Shape, shape_from_dict


_REGISTRY: dict[str, type["Action"]] = {}


def register(cls: type["Action"]) -> type["Action"]:
    """Class decorator: make ``cls`` known to :func:`from_dict` under its class name."""
    _REGISTRY[cls.__name__] = cls
    return cls


def registered() -> dict[str, type["Action"]]:
    """Every action class registered so far. Action classes live with what they make
    (backends in :mod:`testbed.nodes`, other hosts' shares in :mod:`testbed.hosts.share`)
    and register on import; the engine imports them all before it reads a ledger."""
    return dict(_REGISTRY)


@dataclass(frozen=True)
class Action:
    """One step of a plan. Subclasses are frozen dataclasses of JSON-able fields."""

    creates_namespace: ClassVar[bool] = False
    """True when the action creates the namespace named by its ``ns`` field (teardown
    then treats everything inside that namespace as going with it)."""

    def describe(self) -> str:
        return type(self).__name__

    def apply(self, ctx: "ApplyContext") -> None:
        """Create the object. Raise a TestbedError (never log and continue) on failure."""

    def release(self, td: "Teardown") -> None:
        """Teardown's first pass: stop what holds the object (processes, containers)."""

    def undo(self, td: "Teardown") -> None:
        """Teardown's second pass: remove the object; already gone is success."""

    # -------------------------------------------------------------- ledger form
    def to_dict(self) -> dict:
        d: dict[str, object] = {"action": type(self).__name__}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            d[f.name] = v.to_dict() if isinstance(v, Shape) else (list(v) if isinstance(v, tuple) else v)
        return d


@functools.lru_cache(maxsize=None)
def _field_names(cls: type) -> frozenset[str]:
    return frozenset(f.name for f in dataclasses.fields(cls))


@functools.lru_cache(maxsize=None)
def _field_types(cls: type) -> dict[str, str]:
    return {f.name: str(f.type) for f in dataclasses.fields(cls)}


_PLAIN: dict[str, tuple[type, ...]] = {"str": (str,), "int": (int,), "float": (int, float), "bool": (bool,),
                                       "tuple": (tuple,), "None": (type(None),)}


def _fits(annotation: str, v: object) -> bool:
    """Whether ledger value ``v`` has a type the field's annotation (``str``, ``int | None``,
    ``tuple``...) allows; an annotation of another kind is left to the action."""
    kinds = [k.strip() for k in annotation.split("|")]
    if not all(k in _PLAIN for k in kinds):
        return True
    ok = tuple(t for k in kinds for t in _PLAIN[k])
    return isinstance(v, ok) and not (isinstance(v, bool) and bool not in ok)


def from_dict(d: object) -> Action:
    """The action a ledger entry describes; StateError naming the problem otherwise."""
    if not isinstance(d, dict) or not isinstance(d.get("action"), str):
        raise StateError(f"ledger entry {str(d)[:80]!r} names no action")
    cls = _REGISTRY.get(d["action"])
    if cls is None:
        raise StateError(f"ledger entry names an unknown action {d['action']!r}")
    key: type = cls  # as a plain class: mypy takes the dataclass's own __hash__ for the class object's
    kwargs = {}
    names = _field_names(key)
    for k, v in d.items():
        if k == "action":
            continue
        if k not in names:
            raise StateError(f"ledger entry {d['action']}: unknown field {k!r}")
        if k == "shape":
            try:
                v = shape_from_dict(v)
            except TestbedError as e:
                raise StateError(f"ledger entry {d['action']}: bad shape: {e.message}") from None
        elif isinstance(v, list):
            if not all(isinstance(x, (str, int, float, bool)) or x is None for x in v):
                raise StateError(f"ledger entry {d['action']}: field {k!r} holds a nested value")
            v = tuple(v)
        elif not (isinstance(v, (str, int, float, bool)) or v is None):
            raise StateError(f"ledger entry {d['action']}: field {k!r} is not a plain value")
        if not _fits(_field_types(key)[k], v):
            raise StateError(f"ledger entry {d['action']}: field {k!r} should be {_field_types(key)[k]}, "
                             f"got {type(v).__name__}")
        kwargs[k] = v
    try:
        return cls(**kwargs)
    except TypeError as e:
        raise StateError(f"ledger entry {d['action']}: {e}") from None


# ---------------------------------------------------------------------- contexts


class ApplyContext:
    """What actions need while a plan is applied: the host and a few open handles."""

    def __init__(self, testbed: str, host):
        self.testbed = testbed
        self.host = host
        """Where kernel calls happen (:class:`testbed.hosts.local.LocalHost`)."""
        self.results: dict[str, object] = {}
        """Values an action hands back to ``up`` (e.g. the exporter's URL)."""
        self.fault_after_exporter = False
        self.shares: dict[str, dict] = {}
        """Host name -> its share of the plan (what ``testbed _host apply`` is given)."""
        self.pending: list = []
        """(host, thread, result box) of shares being built."""
        self.remotes: dict[str, Any] = {}
        """Host name -> an open connection to it (closed with the context)."""
        self.check = lambda: None
        """Raises if a signal arrived (set by the executor)."""

    def close(self) -> None:
        self.host.close()
        for r in self.remotes.values():
            r.close()
        self.remotes.clear()


@dataclass
class Teardown:
    """State shared by the two passes of a teardown."""

    testbed: str
    owned: set[str]
    """Namespaces this testbed created: objects inside them go with them."""
    host: Any
    """Where kernel calls happen (:class:`testbed.hosts.local.LocalHost`)."""
    kill_in: list[str] = field(default_factory=list)
    """Namespaces whose processes are stopped (all together) between the passes."""
    problems: list[str] = field(default_factory=list)
