"""The gradient volume of the built-in trainer's iterations, for testbed's proof.

The proof's counts (``workloads.collectives``) say what a rank handed to torch.distributed;
they cannot say whether that was its gradients. For the built-in schemes testbed knows
what must travel, so each rank also records, per training iteration:

    handed     gradient elements DDP handed the scheme's hook (None for ``allreduce``,
               which has no hook: DDP's reducer all-reduces every bucket itself)
    floor      the fewest bytes the scheme's collectives must carry for them
               (``workloads.schemes.floors``: summed over the buckets; ``allreduce``: the
               model's dense gradient bytes)
    carried    bytes this rank handed to collectives of two or more ranks and sends to
               other ranks during the iteration, read from torch's flight recorder by the
               ledger (by each entry's creation time) and counted at ``isend``

with the model's trainable element count. testbed.runs.volume checks every rank's every
iteration: DDP handed the hook every element, and carried >= floor. A run of its own hook
(``--scheme hook``) or of a scheme without a floor records the volume, unchecked.

    watch(ddp, scheme)   before the scheme attaches: declare the volume, wrap the hook it registers
    (collectives.iteration() marks each iteration's start; the ledger calls carry and lose)

Iterations whose recorder entries were lost to a wrap of its ring (the ledger knows when)
are marked ``lost`` and not checked: a lost entry weakens the check, never fails it.
"""

from __future__ import annotations

import bisect
import functools
import threading

from workloads import collectives
from workloads.schemes import floors


class Volume:
    """One rank's per-iteration gradient volume (see the module's docstring)."""

    def __init__(self, scheme: str, elements: int, element_bytes: int, dense: bool, checked: bool):
        self.scheme, self.elements, self.element_bytes = scheme, elements, element_bytes
        self.dense = dense
        """No hook: DDP all-reduces every gradient, the floor is the dense bytes."""
        self.checked = checked
        self.starts: list[int] = []
        self.handed: list[int] = []
        self.floor: list[int] = []
        self.carried: list[int] = []
        self.lost: set[int] = set()
        self._lock = threading.Lock()

    def begin(self, t_ns: int) -> None:
        """An iteration starts (the train loop, before its step)."""
        with self._lock:
            self.starts.append(t_ns)
            self.handed.append(0)
            self.floor.append(self.elements * self.element_bytes if self.dense else 0)
            self.carried.append(0)

    def bucket(self, numel: int, floor: int) -> None:
        """DDP handed the hook a bucket of ``numel`` elements; the scheme must send ``floor`` bytes."""
        with self._lock:
            if self.starts:
                self.handed[-1] += numel
                self.floor[-1] += floor

    def _at(self, t_ns: int) -> int:
        return bisect.bisect_right(self.starts, t_ns) - 1

    def carry(self, t_ns: int, nbytes: int) -> None:
        """``nbytes`` handed to a collective (or sent) at ``t_ns``, in the training window."""
        with self._lock:
            i = self._at(t_ns)
            if i >= 0:
                self.carried[i] += nbytes

    def lose(self, t0_ns: int, t1_ns: int) -> None:
        """Recorder entries made between ``t0_ns`` and ``t1_ns`` were lost (not counted)."""
        with self._lock:
            self.lost.update(range(max(0, self._at(t0_ns)), self._at(t1_ns) + 1))

    def to_dict(self) -> dict:
        with self._lock:
            return {"scheme": self.scheme, "checked": self.checked, "elements": self.elements,
                    "element_bytes": self.element_bytes, "handed": None if self.dense else list(self.handed),
                    "floor": list(self.floor), "carried": list(self.carried), "lost": sorted(self.lost)}


def watch(ddp, scheme: str) -> Volume | None:
    """Declare the run's gradient volume to the ledger (None when testbed does not count:
    plain torchrun) and wrap the hook the scheme will register on ``ddp`` so that each bucket
    DDP hands it is counted with its floor. Call before the scheme attaches."""
    ledger = collectives.current()
    if ledger is None:
        return None
    params = [p for p in ddp.module.parameters() if p.requires_grad]
    floor = floors.FLOORS.get(scheme)
    dense = scheme in floors.DENSE
    vol = Volume(scheme, sum(p.numel() for p in params), params[0].element_size() if params else 4, dense,
                 checked=dense or floor is not None)
    register = ddp.register_comm_hook

    @functools.wraps(register)
    def register_comm_hook(state, hook):
        @functools.wraps(hook)
        def counted(st, bucket):
            vol.bucket(bucket.buffer().numel(), floor(st, bucket) if floor is not None else 0)
            return hook(st, bucket)
        return register(state, counted)

    ddp.register_comm_hook = register_comm_hook
    ledger.volume = vol
    return vol
