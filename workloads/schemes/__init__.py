"""Gradient-communication schemes, one module each, registered by name.

Every scheme module has ``attach(ddp, opts, masks=None) -> state``: it registers its DDP
communication hook (if any) and returns a documented state object whose
``take_payload_bytes()`` gives the bytes this rank handed to collectives since the last
call. The train loop calls it once per iteration, and, where the state has them,
``before_step()`` between backward and the optimizer step and ``after_step(optimizer)``
after it (PruneX's ADMM penalty and updates).

Each scheme's hyper-parameters are declared once, in ``workloads.schemes.params``
(``parameters()`` lists them); the train flags, their checks, ``SchemeOptions``, the
summary's ``hyper`` and the variant specs (``parse_variant``) are all derived from them.
This package imports no torch until a scheme is attached.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, make_dataclass
from importlib import import_module
from typing import TYPE_CHECKING, Any

from workloads.schemes.params import PARAMETERS, Choice, Param, Range

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

    from workloads.placement import Placement

__all__ = ["PLUGIN_GROUP", "SCHEMES", "VARIANT_HELP", "Choice", "Param", "PluginError", "Range", "Scheme",
           "SchemeOptions", "check_values", "get",
           "hyper", "names", "options", "parameter", "parameters", "parse_variant", "register", "summary_values"]


@dataclass(frozen=True)
class Scheme:
    name: str
    summary: str
    module: str
    prunes: bool = False
    """The train loop prunes the model (global mask) before attaching the scheme."""

    function: str = "attach"
    """The module's attach function."""

    package: str = ""
    """The installed package (distribution) a plugin scheme comes from; "" for the built-in
    ones and those registered in code."""

    @property
    def module_path(self) -> str:
        """The attach function's module: one of this package's, or (a plugin's, or a scheme
        registered from outside, :func:`register`) a dotted path of its own."""
        return self.module if self.package or "." in self.module else f"{__name__}.{self.module}"

    def check_installed(self) -> None:
        """PluginError when a plugin's module cannot be found (its package's own
        ``__init__`` is imported to look; the module itself, with its torch, is not)."""
        from importlib.util import find_spec

        if not self.package:
            return
        try:
            found = find_spec(self.module_path) is not None
        except (ImportError, ValueError) as e:
            raise PluginError(f"scheme {self.name!r} of package {self.package!r}: {self.module_path} cannot be "
                              f"imported: {e}") from None
        if not found:
            raise PluginError(f"scheme {self.name!r} of package {self.package!r}: no module {self.module_path}; "
                              "reinstall the package, or uninstall it")

    @property
    def attach(self) -> Callable:
        """Its attach function (a plugin's module is imported only now: in the ranks)."""
        try:
            return getattr(import_module(self.module_path), self.function)
        except (ImportError, AttributeError) as e:
            if not self.package:
                raise
            raise PluginError(f"scheme {self.name!r} of package {self.package!r} cannot be loaded from "
                              f"{self.module_path}:{self.function}: {e}") from None

    @property
    def parameters(self) -> tuple[Param, ...]:
        """Its declared hyper-parameters (``workloads.schemes.params``), in declaration order."""
        return tuple(p for p in PARAMETERS if self.name in p.schemes)

    @property
    def params(self) -> tuple[str, ...]:
        """Names of the hyper-parameters that change its results and are recorded (the
        summary's ``hyper``, what report tells variants apart by); variants set them by name."""
        return tuple(p.name for p in self.parameters if p.recorded)

    @property
    def positional(self) -> tuple[str, ...]:
        """Parameters that bare values in a variant spec set, in order (``topk:0.1``)."""
        return tuple(p.name for p in self.parameters if self.name in p.positional)

    @property
    def words(self) -> tuple[tuple[str, str, str], ...]:
        """(word, parameter, value): bare words in a variant spec (``pactrain:0.5:exact``)."""
        return tuple((w, p.name, p.word_value(w)) for p in self.parameters for w in p.all_words)


SCHEMES: dict[str, Scheme] = {s.name: s for s in [
    Scheme("allreduce", "DDP's default all-reduce (no hook)", "allreduce"),
    Scheme("fp16", "torch's fp16 compression hook", "fp16"),
    Scheme("topk", "top-k with error feedback, all-gather of values + int32 indices", "topk"),
    Scheme("powersgd", "torch's PowerSGD hook", "powersgd"),
    Scheme("terngrad", "ternary stochastic quantisation, per-layer max scale, clipped, int8 sum", "terngrad"),
    Scheme("pactrain", "pruning + mask tracker + compact all-reduce + ternary (pactrain:exact: without)", "pactrain",
           prunes=True),
    Scheme("spardl", "SparDL: sparse reduce-scatter, global residual collection, Bruck all-gather", "spardl"),
    Scheme("gtopk", "gTop-k: global top-k by recursive doubling of (value, position) pairs (SparDL's baseline)",
           "gtopk"),
    Scheme("prunex", "PruneX: ADMM channel pruning + hierarchical compact all-reduce via switch leaders", "prunex"),
    Scheme("hier-allreduce", "dense hierarchical all-reduce via switch leaders (PruneX without pruning)", "prunex",
           function="attach_hier"),
    Scheme("hook", "your own DDP communication hook, by import path (--hook package.module:factory)", "hook"),
]}

class PluginError(ValueError):
    """A scheme installed as a package (entry point group ``testbed.schemes``) is broken."""


PLUGIN_GROUP = "testbed.schemes"
"""Entry-point group of schemes installed as packages: ``NAME = "package.module:attach"``."""
_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
"""A plugin scheme's name (no ':', which splits a variant spec)."""
PLUGIN_WARNINGS: list[str] = []
"""One line per plugin entry that was skipped (a clash with a registered name, a bad name)."""
_plugins_read = False


def _read_plugins() -> None:
    """Register the schemes that installed packages declare (once, on first use of the
    registry), without importing them: a broken one fails where it is used, by name."""
    global _plugins_read
    if _plugins_read:
        return
    _plugins_read = True
    from workloads.entrypoints import installed, package, printable

    for ep in installed(PLUGIN_GROUP, PLUGIN_WARNINGS):
        dist = package(ep)
        module, _, function = ep.value.partition(":")
        if ep.name in SCHEMES or not _NAME.fullmatch(ep.name) or not module or not function:
            why = "already a scheme" if ep.name in SCHEMES else "not NAME = package.module:function"
            PLUGIN_WARNINGS.append(f"plugin scheme {printable(ep.name)!r} of package {dist!r} is skipped: {why}")
            continue
        metadata = ep.dist.metadata if ep.dist is not None else None
        summary = printable((metadata["Summary"] if metadata is not None and "Summary" in metadata else None)
                            or f"from package {dist}")
        SCHEMES[ep.name] = Scheme(ep.name, f"{summary} (package {dist})", module.strip(),
                                  function=function.strip(), package=dist)


_BY_NAME: dict[str, Param] = {p.name: p for p in PARAMETERS}
for _p in PARAMETERS:  # a declaration naming a scheme that does not exist is a bug, found at import
    assert set(_p.schemes) <= set(SCHEMES), f"{_p.name}: unknown scheme in {_p.schemes}"


def register(scheme: Scheme) -> None:
    """Add a scheme from outside this package (``Scheme(name, summary, "package.module")``):
    the one registration a new scheme without hyper-parameters of its own needs. Register
    it in the ranks too (their ``workloads.train`` reads this registry)."""
    if not scheme.name or ":" in scheme.name:
        raise ValueError(f"invalid scheme name {scheme.name!r}: a variant spec splits at ':'")
    SCHEMES[scheme.name] = scheme


def names() -> tuple[str, ...]:
    """Every registered scheme's name, in registry order (``allreduce`` first; the installed
    packages' last)."""
    _read_plugins()
    return tuple(SCHEMES)


def get(name: str) -> Scheme:
    _read_plugins()
    if name not in SCHEMES:
        raise ValueError(f"unknown scheme {name!r}; choose one of: {', '.join(SCHEMES)}")
    return SCHEMES[name]


def parameters(scheme: str | None = None) -> tuple[Param, ...]:
    """The declared hyper-parameters (``workloads.schemes.params.Param``), in flag order:
    of every scheme, or of the scheme named ``scheme`` (ValueError if there is none).

    Each gives ``name``, ``flag`` (the ``workloads.train`` flag), ``type``, ``default``,
    ``help``, ``schemes``, ``check`` (``Range``/``Choice``/None, ``str()`` says the valid
    values) and ``validate(value)``: enough for a launcher to build and check its own flags.
    """
    return PARAMETERS if scheme is None else get(scheme).parameters


def parameter(name: str) -> Param:
    """The declaration of the hyper-parameter ``name`` (ValueError listing them if none)."""
    if name not in _BY_NAME:
        raise ValueError(f"unknown scheme hyper-parameter {name!r}; choose one of: {', '.join(_BY_NAME)}")
    return _BY_NAME[name]


def check_values(values: Mapping[str, object]) -> None:
    """Validate every declared hyper-parameter present in ``values`` (e.g. ``vars(args)``);
    ValueError names the first bad one's flag and the values it accepts."""
    for p in PARAMETERS:
        if p.name in values:
            p.validate(values[p.name])


def hyper(scheme: str | Scheme, values: Mapping[str, object]) -> dict:
    """The scheme's hyper-parameters that change its results, from ``values`` (which holds
    every declared one, e.g. ``vars(args)``): the scheme part of the summary's ``hyper``."""
    scheme = scheme if isinstance(scheme, Scheme) else get(scheme)
    own = {p.name for p in scheme.parameters}
    return {p.name: values[p.name] for p in scheme.parameters
            if p.recorded and not (p.needs in own and not values[p.needs])}


def summary_values(scheme: str | Scheme, values: Mapping[str, object]) -> dict:
    """The hyper-parameters that are also top-level keys of summary.json: each its value
    under a scheme that has it, else None."""
    name = scheme.name if isinstance(scheme, Scheme) else get(scheme).name
    return {p.name: values[p.name] if name in p.schemes else None for p in PARAMETERS if p.summary_key}


@dataclass(frozen=True)
class _Context:
    """What a scheme is told besides its hyper-parameters."""

    process_group: ProcessGroup | None = None
    """torch.distributed group (None: the default group)."""
    device: str = "cpu"
    """Where random generators live (the gradients' device)."""
    seed: int = 0
    placement: Placement | None = None
    """workloads.placement.Placement of all ranks (domains = switches under testbed)."""
    total_iters: int = 1
    """Iterations the run will make (schedules that are fractions of the run)."""


def _check_options(self) -> None:
    check_values({p.name: getattr(self, p.name) for p in PARAMETERS})


if TYPE_CHECKING:
    class SchemeOptions(_Context):
        """As the type checker sees the class made below: the context's fields, typed, and
        the hyper-parameters' fields (made from ``PARAMETERS``) as Any."""

        def __init__(self, **values: Any) -> None: ...

        def __getattr__(self, name: str) -> Any: ...
else:
    SchemeOptions = make_dataclass(
        "SchemeOptions", [(p.name, p.type, field(default=p.default, metadata={"help": p.help})) for p in PARAMETERS],
        bases=(_Context,), frozen=True, namespace={
            "__post_init__": _check_options,
            "__doc__": "What ``attach(ddp, opts, masks)`` reads: the context (process_group, device, seed, "
                       "placement, total_iters) and one field per declared hyper-parameter (``parameters()``: "
                       "name, default, help), each checked on construction (ValueError naming the flag)."})
    SchemeOptions.__module__ = __name__


def options(values: Mapping[str, object], **context) -> SchemeOptions:
    """``SchemeOptions`` from the declared hyper-parameters found in ``values`` (e.g.
    ``vars(args)``; the others keep their defaults) and the context given as keywords
    (``device``, ``seed``, ``placement``, ``total_iters``, ``process_group``)."""
    return SchemeOptions(**context, **{p.name: values[p.name] for p in PARAMETERS if p.name in values})


VARIANT_HELP = ("a scheme, or a variant NAME:VALUE[:...] setting its hyper-parameters, e.g. topk:0.1, "
                "pactrain:0.8:exact, powersgd:8, terngrad:clip=0, pactrain:0.5:grasp:stable_iters=5")


def parse_variant(spec: str) -> tuple[Scheme, dict[str, str]]:
    """``topk:0.1`` -> (topk, {"topk_ratio": "0.1"}): a scheme name, then bare values for its
    positional parameters in order, words it knows (``exact``, ``grasp``) and
    ``param=value`` for any of its parameters. Values stay strings (the train parser
    converts and checks them); ValueError names what is wrong."""
    if not isinstance(spec, str) or not spec:
        raise ValueError("the scheme is empty; " + VARIANT_HELP)
    name, *tokens = spec.split(":")
    scheme = get(name)
    values: dict[str, str] = {}
    free = list(scheme.positional)
    words = {w: (k, v) for w, k, v in scheme.words}
    for tok in tokens:
        if "=" in tok:
            key, val = tok.split("=", 1)
            key = key.replace("-", "_")
            short = {p.removeprefix(f"{name}_"): p for p in scheme.params}
            key = short.get(key, key)
            if key not in scheme.params:
                raise ValueError(f"scheme variant {spec!r}: {name} has no parameter {key!r}; "
                                 f"its parameters: {', '.join(scheme.params) or 'none'}")
        elif tok in words:
            key, val = words[tok]
        else:
            while free and free[0] in values:  # set by name already
                free.pop(0)
            if not free:
                hint = f"; words: {', '.join(words)}" if words else ""
                raise ValueError(f"scheme variant {spec!r}: unexpected {tok!r} "
                                 f"({name} takes {len(scheme.positional)} bare value(s){hint}); " + VARIANT_HELP)
            key, val = free.pop(0), tok
        if not val:
            raise ValueError(f"scheme variant {spec!r}: {key} has no value")
        if key in values:
            raise ValueError(f"scheme variant {spec!r}: {key} is set twice")
        values[key] = val
    return scheme, values
