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
    if not module or not attr:
        raise ValueError(f"--hook {spec}: {HINT}")
    try:
        factory = getattr(importlib.import_module(module), attr)
    except Exception as e:  # noqa: BLE001 - the module's own code may raise anything while imported
        raise ValueError(f"--hook {spec}: {_said(e)}") from None
    if not callable(factory):
        raise ValueError(f"--hook {spec}: {attr} is not callable; {HINT}")
    return factory


HINT = "name a factory, package.module:function, that takes the process group and returns (state, hook)"


def _said(e: BaseException) -> str:
    """An exception as one line: its type and its message."""
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text[:300]}{'...' if len(text) > 300 else ''}"


def _register(ddp, spec: str, factory, process_group):
    """``ddp.register_comm_hook(*factory(process_group))``; ValueError (one line naming
    ``spec``) when the factory fails, returns no ``(state, hook)`` or torch refuses the hook."""
    try:
        got = factory(process_group)
    except Exception as e:  # noqa: BLE001 - a standard-library function is no factory: os.path:join raises TypeError
        raise ValueError(f"--hook {spec}: calling it with the process group raised {_said(e)}; {HINT}") from None
    if not (isinstance(got, tuple) and len(got) == 2 and callable(got[1])):
        raise ValueError(f"--hook {spec}: the factory must return (state, hook), got {type(got).__name__}; "
                         f"{HINT}")
    state, hook = got
    try:
        ddp.register_comm_hook(state, hook)
    except (TypeError, ValueError, RuntimeError) as e:
        raise ValueError(f"--hook {spec}: DDP refused its hook: {_said(e)}; a hook takes (state, bucket) and "
                         f"returns a torch.futures.Future") from None
    return state


@dataclass
class HookState:
    user_state: object
    wire: IfaceCounters | None
    last_tx: int = 0

    @property
    def payload_source(self) -> str:
        return "hook" if callable(getattr(self.user_state, "take_payload_bytes", None)) else "wire"

    def take_payload_bytes(self) -> int:
        take = getattr(self.user_state, "take_payload_bytes", None)
        if callable(take):  # the user's state counts its own (payload_source "hook")
            return int(take())
        if self.wire is None:
            return 0
        tx = self.wire.read()[0]
        sent, self.last_tx = tx - self.last_tx, tx
        return sent


def attach(ddp, opts, masks=None) -> HookState:
    factory = load(opts.hook, opts.hook_path)
    state = _register(ddp, opts.hook, factory, opts.process_group or dist.group.WORLD)
    iface = iface_from_env(None)
    wire = IfaceCounters(iface) if iface else None
    return HookState(state, wire, wire.read()[0] if wire else 0)
