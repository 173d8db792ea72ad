"""``hook``: your own DDP communication hook in testbed's training loop.

``--hook package.module:factory`` names a function that every rank calls once with the
default process group and that returns ``(state, hook)``; the hook is registered as torch's
own are, ``ddp.register_comm_hook(state, hook)``, so torch's hooks work as they are, e.g.
a module with ``def factory(pg): return pg, default_hooks.fp16_compress_hook``. The module
is imported from ``--hook-path`` (testbed run: the directory it was started from), else
from the rank's Python (under plain torchrun, ``python -m`` puts the working directory on
the path).

Payload accounting: when ``state`` has ``take_payload_bytes()`` (bytes this rank handed to
collectives since the last call, as testbed's schemes do), it is used; otherwise the bytes
this rank's data-plane interface sent during the iteration are (measured on the wire;
``payload_source`` in the state says which).
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass

import torch.distributed as dist

from workloads.records import IfaceCounters, iface_from_env


def load(spec: str, path: str):
    """The factory ``spec`` names (ValueError, naming it, when it cannot be had)."""
    if not spec:
        raise ValueError("scheme hook needs --hook package.module:factory")
    if path:
        sys.path.insert(0, path)
    module, _, attr = spec.partition(":")
    try:
        factory = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"--hook {spec}: {type(e).__name__}: {e}") from None
    if not callable(factory):
        raise ValueError(f"--hook {spec}: {attr} is not callable")
    return factory


@dataclass
class HookState:
    user_state: object
    wire: IfaceCounters | None
    last_tx: int = 0

    @property
    def payload_source(self) -> str:
        return "hook" if callable(getattr(self.user_state, "take_payload_bytes", None)) else "wire"

    def take_payload_bytes(self) -> int:
        if self.payload_source == "hook":
            return int(self.user_state.take_payload_bytes())
        if self.wire is None:
            return 0
        tx = self.wire.read()[0]
        sent, self.last_tx = tx - self.last_tx, tx
        return sent


def attach(ddp, opts, masks=None) -> HookState:
    factory = load(opts.hook, opts.hook_path)
    got = factory(opts.process_group or dist.group.WORLD)
    if not (isinstance(got, tuple) and len(got) == 2 and callable(got[1])):
        raise ValueError(f"--hook {opts.hook}: the factory must return (state, hook), got {type(got).__name__}")
    state, hook = got
    ddp.register_comm_hook(state, hook)
    iface = iface_from_env(None)
    wire = IfaceCounters(iface) if iface else None
    return HookState(state, wire, wire.read()[0] if wire else 0)
