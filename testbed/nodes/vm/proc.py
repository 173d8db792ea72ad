"""A VM worker's QEMU and guest, seen from the host: judged, stopped, waited for.

QEMU is found by its marker (:mod:`testbed.nodes.vm.qemu`). What the host can tell about a
guest that does not answer:

* its QEMU exited (killed, crashed, the guest powered off): no process carries the marker;
* its QEMU is stopped (SIGSTOP, a debugger): the process is in state T or t, and the guest,
  its agent with it, is frozen in time until SIGCONT;
* neither, yet the agent does not answer a ping: the guest itself hangs.

:class:`AwaitVMs` waits after boot until every guest's agent answers, and names the node
whose agent does not (and why, when the host can tell). :func:`stop_qemu` returns only
once QEMU has exited, or fails naming the process that SIGKILL did not end (a frozen or
kernel-stuck process), so that ``down`` never reports a VM removed that still runs.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from testbed.common import procs
from testbed.common.digits import ascii_int
from testbed.common.errors import TestbedError
from testbed.common.files import tail_text
from testbed.nodes.vm.qemu import node_of, qemu_pids, qemu_trouble
from testbed.plan.actions import ApplyContext, Action, register

READY_TIMEOUT = float(ascii_int(os.environ.get("TESTBED_VM_READY_TIMEOUT", ""), 6) or 180)
"""Seconds a VM's agent may take to answer after boot (``TESTBED_VM_READY_TIMEOUT``, whole
seconds; anything else: 180)."""
BOOT_GRACE_S = 5.0
"""How long QEMU may take to appear after StartVM (a helper joins the namespace, then execs it)."""
STOP_GRACE_S, KILL_WAIT_S = 3.0, 3.0


def vm_dir(ns: str) -> Path:
    from testbed.common.state import state_root

    return state_root() / "vm" / ns


def why_stopped(ns: str, probe: float = 5.0) -> str | None:
    """Why a rank in the VM of ``ns`` may have died or hung: its QEMU exited or is stopped,
    or its guest's agent does not answer a ping within ``probe`` seconds. None: it answers."""
    from testbed.nodes.vm.relay import request  # (not at import: `python -m testbed.nodes.vm.relay` imports this package)

    d = vm_dir(ns)
    if not qemu_pids(ns):
        return f"its VM is no longer running (QEMU exited): {console_tail(d)}"
    trouble = qemu_trouble(ns)
    if trouble:
        return f"its VM is not answering: {trouble}"
    try:
        request(ns, d, "ping", timeout=probe)
    except (OSError, RuntimeError, ValueError, KeyError, TestbedError):
        return f"its VM is not answering: its guest agent did not answer a ping within {probe:.0f} s"
    return None


def console_tail(d: Path, n: int = 3) -> str:
    lines = []
    for name in ("qemu.log", "console.log"):
        try:
            lines += [x for x in tail_text(d / name).strip().splitlines() if x.strip()][-n:]
        except OSError:
            pass
    return " | ".join(lines[-n:]) or "no output"


def stop_qemu(ns: str) -> None:
    """Stop the VM of ``ns`` and return once its QEMU has exited (a stopped QEMU is
    continued to act on SIGTERM); a TestbedError naming the process if SIGKILL did not end it."""
    procs.stop(qemu_pids(ns), f"node {node_of(ns)}'s QEMU", grace=STOP_GRACE_S, kill_wait=KILL_WAIT_S)


def remove_vm_dir(d: Path) -> None:
    """A VM's state directory, and ``vm/`` with it when it was the last."""
    if d.is_dir() and not d.is_symlink():
        shutil.rmtree(d, ignore_errors=True)
    try:
        d.parent.rmdir()
    except OSError:
        pass


def forget_vms(namespaces) -> None:
    """What VM workers in ``namespaces`` leave when their ledger is lost (``down --all``):
    QEMU processes and their state directories."""
    for ns in namespaces:
        procs.terminate(qemu_pids(ns), grace=STOP_GRACE_S, kill_wait=KILL_WAIT_S)
        remove_vm_dir(vm_dir(ns))


@register
@dataclass(frozen=True)
class AwaitVMs(Action):
    """Wait until the agent of every VM answers (they boot in parallel meanwhile)."""

    nodes: tuple = ()
    """Alternating (namespace, VM directory) pairs."""

    def describe(self) -> str:
        return f"wait for {len(self.nodes) // 2} VM(s) to boot"

    def apply(self, ctx: ApplyContext) -> None:
        pending = dict(zip(self.nodes[::2], self.nodes[1::2]))
        started = time.monotonic()
        while pending:
            for ns, d in list(pending.items()):
                if _answers(ns, Path(d)):
                    del pending[ns]
                elif not qemu_pids(ns) and time.monotonic() > started + BOOT_GRACE_S:
                    raise TestbedError(f"node {node_of(ns)}: its VM (QEMU) exited while booting: "
                                       f"{console_tail(Path(d))}", f"see {d}/console.log and {d}/qemu.log")
            if pending and time.monotonic() > started + READY_TIMEOUT:
                raise _not_ready(pending)
            if pending:
                time.sleep(0.5)


def _answers(ns: str, d: Path) -> bool:
    from testbed.nodes.vm.relay import request

    try:
        request(ns, d, "ping", timeout=2.0)
        return True
    except (OSError, RuntimeError, ValueError, KeyError, TestbedError):
        return False


def _not_ready(pending: dict[str, str]) -> TestbedError:
    """The error naming a VM whose agent did not answer in time (one whose QEMU is stopped first)."""
    trouble = {ns: qemu_trouble(ns) for ns in pending}
    ns = next((ns for ns, why in trouble.items() if why), next(iter(pending)))
    d = pending[ns]
    why = f", and {trouble[ns]}" if trouble[ns] else ""
    others = [node_of(x) for x in pending if x != ns]
    also = f"; not ready either: {', '.join(others)}" if others else ""
    return TestbedError(f"node {node_of(ns)}: its guest agent did not answer within {READY_TIMEOUT:.0f} s{why}; "
                        f"console: {console_tail(Path(d))}{also}",
                        f"see {d}/console.log; TESTBED_VM_READY_TIMEOUT=SECONDS allows longer")
