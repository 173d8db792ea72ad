"""The schemes' hyper-parameters, each declared once.

A :class:`Param` holds everything the rest of the code needs to know about one
hyper-parameter, and everything else is derived from ``PARAMETERS``:

- the flags of ``python -m workloads.train`` (``--topk-ratio`` ...), their defaults and help;
- their validation (:meth:`Param.validate`: the error names the flag and the valid values);
- the fields of ``workloads.schemes.SchemeOptions`` (what a scheme's ``attach`` reads);
- the summary's ``hyper`` (what report tells runs apart by) and its top-level keys;
- the variant specs (``topk:0.1``, ``pactrain:0.5:ternary``: ``workloads.schemes.parse_variant``).

This module imports nothing but the standard library (no torch), so that launchers such
as ``testbed run`` can read the declarations to build their own flags cheaply.

Adding a hyper-parameter: add one ``Param`` below, and read it as ``opts.NAME`` in the
scheme's ``attach``. The flag, its check, its place in ``hyper`` and in variants follow.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Range:
    """Finite numbers between ``low`` and ``high`` (None: no bound on that side)."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    """``low`` itself is excluded."""
    high_open: bool = False
    """``high`` itself is excluded."""

    def accepts(self, value) -> bool:
        try:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                return False
        except OverflowError:  # an int past float's range (400 digits)
            return False
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return self.high is None or (value < self.high if self.high_open else value <= self.high)

    def __str__(self) -> str:
        if self.low is not None and self.high is not None:
            return f"in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}{')' if self.high_open else ']'}"
        if self.low is not None:
            return f"{'>' if self.low_open else '>='} {self.low:g}"
        if self.high is not None:
            return f"{'<' if self.high_open else '<='} {self.high:g}"
        return "a finite number"


@dataclass(frozen=True)
class Choice:
    """One of a few strings."""

    values: tuple[str, ...]

    def accepts(self, value) -> bool:
        return value in self.values

    def __str__(self) -> str:
        return ", ".join(self.values[:-1]) + " or " + self.values[-1] if len(self.values) > 1 else self.values[0]


@dataclass(frozen=True)
class ImportPath:
    """``package.module:attribute`` (or empty: not set)."""

    def accepts(self, value) -> bool:
        return value == "" or (isinstance(value, str) and re.fullmatch(
            r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*", value) is not None)

    def __str__(self) -> str:
        return "package.module:factory"


SWITCH_VALUES = {"true": True, "yes": True, "on": True, "1": True, "false": False, "no": False, "off": False, "0": False}
"""What ``name=value`` may write for a switch (in a variant spec or a sweep's grid)."""


@dataclass(frozen=True)
class Param:
    """One hyper-parameter of one or more schemes."""

    name: str
    """The one name it has everywhere: the ``SchemeOptions`` field, the workloads.train
    argument, the key in the summary's ``hyper`` and in variant specs (``name=value``)."""
    type: type
    """float, int or str; bool is a switch (``--NAME`` sets it true, ``--no-NAME`` false)."""
    default: object
    help: str
    """What it does, for the flag's help (the schemes, valid values and default are added)."""
    schemes: tuple[str, ...]
    """The schemes whose results it changes."""
    check: Range | Choice | ImportPath | None = None
    """The values it accepts (None: any value of its type)."""
    positional: tuple[str, ...] = ()
    """Schemes in whose variant specs a bare value sets it (``topk:0.1``), in declaration order."""
    words: tuple[str, ...] = ()
    """Bare words in a variant spec that set it: a bool's word sets it true
    (``pactrain:ternary``), a choice's word sets it to that word (``pactrain:grasp``)."""
    off_words: tuple[str, ...] = ()
    """Bare words in a variant spec that set a bool false (``pactrain:exact``)."""
    needs: str | None = None
    """A bool parameter without which it changes nothing, in schemes that have that
    parameter: left out of ``hyper`` while that is off (pactrain's clip needs ternary)."""
    recorded: bool = True
    """In the summary's ``hyper`` and settable by name in variants. False keeps it out of
    both (grasp_batches: it never was recorded, and recorded summaries must group as before)."""
    summary_key: bool = False
    """Also a top-level key of summary.json (null under schemes without it)."""

    def __post_init__(self):
        if self.type is bool and (not isinstance(self.default, bool) or self.check is not None):
            raise ValueError(f"{self.name}: a switch defaults to True or False and takes no check")
        if self.off_words and self.type is not bool:
            raise ValueError(f"{self.name}: only a switch has words that turn it off")
        if self.type is str and self.words and not (isinstance(self.check, Choice)
                                                    and set(self.words) <= set(self.check.values)):
            raise ValueError(f"{self.name}: its words must be among its choices")
        if not set(self.positional) <= set(self.schemes):
            raise ValueError(f"{self.name}: positional in a scheme it does not belong to")
        self.validate(self.default)

    @property
    def flag(self) -> str:
        """The workloads.train flag: ``--`` and the name with dashes (``--topk-ratio``)."""
        return "--" + self.name.replace("_", "-")

    @property
    def no_flag(self) -> str:
        """A switch's flag that turns it off (``--no-ternary``)."""
        return "--no-" + self.name.replace("_", "-")

    def switch_flag(self, value: str) -> str | None:
        """A switch's flag for a written value (``off`` -> ``--no-ternary``); None when the value
        is not one of ``SWITCH_VALUES`` (or this is not a switch)."""
        on = SWITCH_VALUES.get(value.lower()) if self.type is bool else None
        return None if on is None else (self.flag if on else self.no_flag)

    def validate(self, value) -> None:
        """ValueError naming the flag and the values it accepts, unless ``value`` is one."""
        if self.check is not None and not self.check.accepts(value):
            raise ValueError(f"{self.flag} must be {self.check}, got {value!r}")

    @property
    def all_words(self) -> tuple[str, ...]:
        """Every bare word of a variant spec that sets it (``words`` then ``off_words``)."""
        return self.words + self.off_words

    def word_value(self, word: str) -> str:
        """The value a bare ``word`` of a variant spec stands for (a string, as on a command line)."""
        if self.type is bool:
            return "false" if word in self.off_words else "true"
        return word


PARAMETERS: tuple[Param, ...] = (
    # pactrain (its pruning runs in the train loop, before the scheme is attached)
    Param("prune_ratio", float, 0.5, "fraction of conv/linear weights removed", ("pactrain",),
          Range(0, 1, high_open=True), positional=("pactrain",), summary_key=True),
    Param("prune_method", str, "magnitude", "how weights are scored for pruning", ("pactrain",),
          Choice(("magnitude", "grasp")), words=("magnitude", "grasp")),
    Param("grasp_batches", int, 2, "batches scored by --prune-method grasp", ("pactrain",), Range(1),
          recorded=False),
    Param("ternary", bool, True, "ternary-quantise the compact tensor, as the paper's PacTrain does "
          "(--no-ternary: an exact fp32 compact all-reduce)", ("pactrain",), words=("ternary",),
          off_words=("exact",), summary_key=True),
    Param("stable_iters", int, 3, "K iterations of an unchanged mask before a bucket is compacted",
          ("pactrain",), Range(1)),
    # topk
    Param("topk_ratio", float, 0.01, "fraction of elements sent", ("topk", "gtopk"), Range(0, 1, low_open=True),
          positional=("topk", "gtopk"), summary_key=True),
    # terngrad, and pactrain's ternary quantisation
    Param("terngrad_clip", float, 2.5, "clip to N std deviations (0: off)", ("terngrad", "pactrain"), Range(0),
          positional=("terngrad",), needs="ternary"),
    # powersgd
    Param("powersgd_rank", int, 4, "matrix approximation rank", ("powersgd",), Range(1), positional=("powersgd",)),
    Param("powersgd_start_iter", int, 10, "iterations of plain all-reduce before compressing (DDP rebuilds "
          "its buckets after iteration 1)", ("powersgd",), Range(2)),
    # spardl
    Param("spardl_density", float, 0.01, "fraction of each block's entries sent (the paper's experiments: 0.01)",
          ("spardl",), Range(0, 1, low_open=True), positional=("spardl",), summary_key=True),
    Param("spardl_teams", str, "auto", "1 (one team, as the published code), switch (a team per switch) or "
          "auto (switch when the switches hold equal numbers of ranks)", ("spardl",), Choice(("1", "switch", "auto"))),
    Param("spardl_d", int, 0, "d, the number of teams (the paper's latency-bandwidth knob): d equal teams of "
          "consecutive ranks in switch order, d dividing the ranks; 0: as --spardl-teams says", ("spardl",), Range(0)),
    Param("spardl_h", str, "adaptive", "entries h an owner keeps per team: adaptive (the published code's rule) "
          "or fixed (k / d)", ("spardl",), Choice(("adaptive", "fixed")), words=("adaptive", "fixed")),
    # prunex
    Param("prunex_sparsity", float, 0.5, "fraction of output channels removed", ("prunex",),
          Range(0, 1, high_open=True), positional=("prunex",), summary_key=True),
    Param("prunex_rho", float, 0.1, "ADMM penalty weight", ("prunex",), Range(0)),
    Param("prunex_admm_every", int, 0, "iterations between Z/U updates (0: at least 15 updates before the masks "
          "are fixed)", ("prunex",), Range(0)),
    Param("prunex_prune_at", float, 0.3, "fraction of the run after which channel masks are fixed", ("prunex",),
          Range(0, 1)),
    # hook: the user's own DDP communication hook
    Param("hook", str, "", "your DDP communication hook's factory, by import path: factory(process_group) -> "
          "(state, hook), registered as ddp.register_comm_hook(state, hook)", ("hook",), ImportPath(),
          summary_key=True),
    Param("hook_path", str, "", "a directory --hook's module is imported from (testbed run: where it was "
          "started)", ("hook",), recorded=False),
)
"""Every scheme hyper-parameter, in the order of the flags (and of ``hyper``)."""
