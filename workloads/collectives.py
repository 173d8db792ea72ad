"""What this rank handed to torch.distributed, for testbed's proof that it crossed the links.

Whoever issues a collective (DDP's reducer in C++, a communication hook, the user's own
code; gloo or NCCL), it reaches a process group, and torch's flight recorder records it
there with its kind, sizes, dtypes and group (``TORCH_FR_BUFFER_SIZE`` > 0, which testbed
sets in every rank's environment). That is why the recorder, not a wrapping process group
or the profiler, is the counter here: it sees C++ callers, needs no change to the user's
code, and costs one ring-buffer entry per collective (``benchmarks.proof_overhead``).

NCCL keeps a recorder of its own (its entries hold CUDA events), dumped here too.
It does not record gloo's point-to-point operations, and records neither a broadcast's root
nor a send's peer. So ``isend`` (which ``send`` and ``batch_isend_irecv`` go through) is
wrapped here and counts bytes per destination rank; NCCL's recorded send/recv entries are
then skipped so that nothing counts twice.

    activate()      from the environment: ``TESTBED_COLLECTIVES`` names this rank's file;
                    nothing happens without it (plain torchrun)
    training()      the built-in trainer's training iterations begin; ``aside()`` brackets
                    what is not their exchange (evaluations, DDP's bucket rebuild),
                    ``trained()`` ends them. User code: every collective is its training's.
    iteration()     the built-in trainer's next iteration starts: with a ``volume``
                    (``workloads.volume``, set by the trainer), each training-window entry
                    of a group of two or more ranks and each send to another rank is also
                    counted against the iteration it was made in
    finish()        fold the recorder's entries and write the file (also done before a
                    ``destroy_process_group``, while the groups' members are still known)

The file: ``{"rank", "recorder_entries", "groups": {name: [global ranks]}, "ops": [{"phase",
"group", "kind", "count", "in_bytes", "out_bytes"}], "sends": [{"phase", "dst", "count",
"bytes"}], "uncounted": N, "volume": {...}}``; phase is "train" or "other"; ``volume`` only from
the built-in trainer (``workloads.volume``). testbed.runs.proof reads it.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import io
import json
import math
import os
import pickle
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

ENV = "TESTBED_COLLECTIVES"
"""This rank's collectives file (set by testbed's launcher)."""
STARTED_ENV = "TESTBED_STARTED"
"""A file rank 0 creates when training starts: testbed reads the links' counters then."""
RECORDER_ENV = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
RECORDER_ENTRIES = 1 << 17
"""Flight-recorder ring size testbed asks for: about 800 B per entry when full (measured),
folded at evaluations before it wraps; entries lost to a wrap are reported as uncounted."""
ITEM_BYTES = {"Float": 4, "Double": 8, "Half": 2, "BFloat16": 2, "Long": 8, "Int": 4, "Short": 2, "Char": 1,
              "Byte": 1, "Bool": 1, "ComplexFloat": 8, "ComplexDouble": 16, "ComplexHalf": 4, "UInt16": 2,
              "UInt32": 4, "UInt64": 8, "Float8_e4m3fn": 1, "Float8_e5m2": 1, "Float8_e4m3fnuz": 1,
              "Float8_e5m2fnuz": 1}
DUMPS = ("_dump_fr_trace", "_dump_nccl_trace")
"""The recorders' dumps: gloo's (and other CPU backends'), and NCCL's own recorder (its
entries hold CUDA events; in CUDA builds only). Record ids count per recorder."""
KINDS = {"allreduce": "all_reduce", "allgather": "all_gather", "reducescatter": "reduce_scatter",
         "broadcast": "broadcast", "reduce": "reduce", "gather": "gather", "scatter": "scatter",
         "alltoall": "all_to_all", "alltoallsingle": "all_to_all", "barrier": "barrier", "send": "send",
         "recv": "recv", "recvanysource": "recv"}


def kind_of(profiling_name: str) -> str:
    """"gloo:all_reduce", "nccl:_allgather_base", "nccl:reduce_scatter_tensor_coalesced" ->
    the collective's kind (all_reduce, all_gather, ...), or the name itself when unknown."""
    op = profiling_name.rsplit(":", 1)[-1].lower().strip("_")
    for part in ("_coalesced", "_into_tensor", "_tensor", "_base", "_oop"):
        op = op.replace(part, "")
    return KINDS.get(op.replace("_", ""), op)


def nbytes(sizes, dtypes) -> int | None:
    """Bytes of the tensors an entry lists (None when a dtype is unknown)."""
    total = 0
    for shape, dtype in zip(sizes or [], dtypes or []):
        if dtype not in ITEM_BYTES:
            return None
        total += math.prod(shape) * ITEM_BYTES[dtype]
    return total


class VolumeLike(Protocol):
    """What the ledger asks of the built-in trainer's ``workloads.volume.Volume`` (which
    imports this module)."""

    def begin(self, t_ns: int) -> None: ...

    def carry(self, t_ns: int, nbytes: int) -> None: ...

    def lose(self, t0_ns: int, t1_ns: int) -> None: ...

    def to_dict(self) -> dict: ...


@dataclass
class _Pause:
    """The span of an :func:`aside` (``time.time_ns()``): its end is None while it lasts."""

    start: int
    end: int | None = None


class Ledger:
    """This rank's collectives, folded from the recorder into totals per phase, group and kind."""

    def __init__(self, path: Path, rank: int):
        self.path, self.rank = path, rank
        self.next_id: dict[str, int] = {}
        """Per recorder: the first record id not yet folded."""
        self.uncounted = 0
        self.entries = 0
        self.groups: dict[str, list[int]] = {}
        self.ops: dict[tuple[str, str, str], list[int]] = {}
        self.sends: dict[tuple[str, int], list[int]] = {}
        self.train_from: int | None = None
        """ns; None: every collective is the training's (user code)."""
        self.train_until: int | None = None
        self.pauses: list[_Pause] = []
        self.since_fold = 0
        """Evaluations since the last fold."""
        self.per_interval: float | None = None
        """Recorder entries per interval between evaluations, as the last fold measured."""
        self.volume: VolumeLike | None = None
        """workloads.volume.Volume of the built-in trainer (None: user code)."""
        self.last_ns: dict[str, int] = {}
        """Per recorder: the creation time of the last entry folded (where a lost range starts)."""

    def phase(self, t_ns: int) -> str:
        if self.train_from is not None and t_ns < self.train_from:
            return "other"
        if self.train_until is not None and t_ns > self.train_until:
            return "other"
        if any(p.start <= t_ns and (p.end is None or t_ns <= p.end) for p in self.pauses):
            return "other"
        return "train"

    def count_send(self, tensor, dst: int) -> None:
        b = tensor.numel() * tensor.element_size()
        now = time.time_ns()
        phase = self.phase(now)
        c = self.sends.setdefault((phase, int(dst)), [0, 0])
        c[0] += 1
        c[1] += b
        if self.volume is not None and phase == "train" and int(dst) != self.rank:
            self.volume.carry(now, b)

    def fold(self) -> None:
        """The recorders' entries since the last fold into the totals; the groups' members."""
        self._groups()
        try:
            from torch._C import _distributed_c10d as c10d_c
        except ImportError:
            return
        for name in DUMPS:
            dump = getattr(c10d_c, name, None)
            try:
                entries = recorder_entries(dump(True, False, False)) if dump else None
            except (RuntimeError, pickle.UnpicklingError, AttributeError):
                continue
            for e in sorted(entries or [], key=lambda e: e["record_id"]):
                first = self.next_id.get(name, 0)
                if e["record_id"] < first:
                    continue
                self.uncounted += e["record_id"] - first  # the ring wrapped before this fold
                if e["record_id"] > first and self.volume is not None:
                    self.volume.lose(self.last_ns.get(name, 0), int(e.get("time_created_ns") or 0))
                self.next_id[name] = e["record_id"] + 1
                self.last_ns[name] = int(e.get("time_created_ns") or 0)
                self.entries += 1
                self._add(e)

    @property
    def recorded(self) -> int:
        """Entries the recorders have made so far (as far as the last fold saw)."""
        return sum(self.next_id.values())

    def maybe_fold(self) -> None:
        self.since_fold += 1
        if self.per_interval is None or (self.since_fold + 1) * self.per_interval > RECORDER_ENTRIES // 2:
            before = self.recorded
            self.fold()
            self.per_interval = (self.recorded - before) / self.since_fold
            self.since_fold = 0

    def _add(self, e: dict) -> None:
        kind = kind_of(str(e.get("profiling_name", "")))
        if e.get("is_p2p") or kind in ("send", "recv"):
            return  # counted by the isend wrapper, with its peer
        group = str((e.get("process_group") or ("?",))[0])
        inb = nbytes(e.get("input_sizes"), e.get("input_dtypes"))
        outb = nbytes(e.get("output_sizes"), e.get("output_dtypes"))
        t_ns = int(e.get("time_created_ns") or 0)
        key = (self.phase(t_ns), group, kind)
        c = self.ops.setdefault(key, [0, 0, 0, 0])
        c[0] += 1
        c[1] += inb or 0
        c[2] += outb or 0
        c[3] += inb is None or outb is None  # a dtype whose size is unknown: not bounded
        if self.volume is not None and key[0] == "train" and kind != "barrier" and len(self.groups.get(group, [])) > 1:
            self.volume.carry(t_ns, inb or 0)  # the iteration's bytes between ranks (workloads.volume)

    def _groups(self) -> None:
        with contextlib.suppress(Exception):  # private API: the names may move
            import torch.distributed as dist
            from torch.distributed import distributed_c10d as c10d

            for pg, name in list(c10d._world.pg_names.items()):
                self.groups[str(name)] = [int(r) for r in dist.get_process_group_ranks(pg)]

    def to_dict(self) -> dict:
        recorder = max((_int(os.environ.get(k)) for k in RECORDER_ENV), default=0)
        return {
            "rank": self.rank, "recorder_entries": recorder, "entries": self.entries,
            "uncounted": self.uncounted, "groups": self.groups,
            "ops": [{"phase": p, "group": g, "kind": k, "count": c[0], "in_bytes": c[1], "out_bytes": c[2],
                     "unsized": c[3]} for (p, g, k), c in sorted(self.ops.items())],
            "sends": [{"phase": p, "dst": d, "count": c[0], "bytes": c[1]} for (p, d), c in sorted(self.sends.items())],
        } | ({} if self.volume is None else {"volume": self.volume.to_dict()})

    def write(self) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        # compact: the built-in trainer's volume holds four numbers an iteration (30 bytes, not 50 indented)
        tmp.write_text(json.dumps(self.to_dict(), separators=(",", ":")) + "\n", encoding="utf-8")
        os.replace(tmp, self.path)


def _int(v) -> int:
    try:
        return int(v)
    except (TypeError, ValueError):
        return 0


_ledger: Ledger | None = None


def activate(started_at_init: bool = False) -> Ledger | None:
    """Start counting when testbed asked for it (``$TESTBED_COLLECTIVES``); idempotent.
    ``started_at_init``: training starts when the process group is up (user code, which has
    no other moment testbed can know); else at :func:`training`."""
    global _ledger
    path = os.environ.get(ENV)
    if _ledger is not None or not path:
        return _ledger
    _ledger = Ledger(Path(path), _int(os.environ.get("RANK")))
    _wrap(started_at_init)
    return _ledger


def _started() -> None:
    """Rank 0 tells testbed that training starts (an empty file; a failure only costs that)."""
    path = os.environ.get(STARTED_ENV)
    if path and os.environ.get("RANK") == "0":
        with contextlib.suppress(OSError):
            Path(path).touch()


def _wrap(started_at_init: bool) -> None:
    """``isend`` counts its bytes and peer; ``destroy_process_group`` folds first;
    ``init_process_group`` marks the start when asked to."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    isend, destroy, init = c10d.isend, c10d.destroy_process_group, c10d.init_process_group
    sig = inspect.signature(isend)

    @functools.wraps(isend)
    def counted_isend(*args, **kwargs):
        if _ledger is not None:
            with contextlib.suppress(Exception):  # counting never breaks the user's send
                a = sig.bind(*args, **kwargs).arguments
                dst = a.get("dst")
                if dst is None:
                    group = a.get("group") or c10d._get_default_group()
                    dst = c10d.get_global_rank(group, a["group_dst"])
                _ledger.count_send(a["tensor"], dst)
        return isend(*args, **kwargs)

    @functools.wraps(destroy)
    def folding_destroy(*args, **kwargs):
        if _ledger is not None:
            _ledger.fold()
        return destroy(*args, **kwargs)

    @functools.wraps(init)
    def marking_init(*args, **kwargs):
        out = init(*args, **kwargs)
        _started()
        return out

    c10d.isend = dist.isend = counted_isend
    c10d.destroy_process_group = dist.destroy_process_group = folding_destroy
    if started_at_init:
        c10d.init_process_group = dist.init_process_group = marking_init


def training() -> None:
    if _ledger is not None:
        _ledger.train_from = time.time_ns()
        _started()


def trained() -> None:
    if _ledger is not None:
        _ledger.train_until = time.time_ns()


def current() -> Ledger | None:
    """This rank's ledger (None: testbed does not count, or not yet activated)."""
    return _ledger


def iteration() -> None:
    """The built-in trainer's next iteration starts (its volume's bins: ``workloads.volume``)."""
    if _ledger is not None and _ledger.volume is not None:
        _ledger.volume.begin(time.time_ns())


@contextlib.contextmanager
def aside():
    """Collectives that are not the training's exchange (an evaluation, DDP's one-time bucket
    rebuild). The recorder is folded after them when the entries to the next could fill half
    its ring (a fold dumps the whole ring: about 40 us per entry, so not at every evaluation)."""
    if _ledger is None:
        yield
        return
    pause = _Pause(time.time_ns())
    _ledger.pauses.append(pause)
    try:
        yield
    finally:
        pause.end = time.time_ns()
        _ledger.maybe_fold()


class _PlainData(pickle.Unpickler):
    """Unpickles containers, strings and numbers only: no global is looked up, so nothing is
    called (a recorder dump is torch's own bytes, made in this process; this keeps it data)."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"a recorder dump named {module}.{name}, which it never holds")


def recorder_entries(dump: bytes) -> list | None:
    """The entries of a flight-recorder dump (``_dump_fr_trace``/``_dump_nccl_trace``), read by
    :class:`_PlainData`. Its JSON variants hold the same but parsed 1.5x slower (0.45 against
    0.29 s for 20,000 entries, measured once on the 2-core machine); the restriction costs
    about 20 % over a plain ``pickle.loads`` (0.155 against 0.128 s), on a fold only."""
    data = _PlainData(io.BytesIO(dump)).load()
    return data.get("entries") if isinstance(data, dict) else None


def finish() -> None:
    """Fold and write this rank's file (a full disk: the rank's records say so already)."""
    if _ledger is None:
        return
    _ledger.fold()
    with contextlib.suppress(OSError):
        _ledger.write()
