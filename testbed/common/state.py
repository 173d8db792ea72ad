"""Where testbed keeps its state: the state directory, private directories, the global lock.

The state dir is ``$TESTBED_STATE_DIR`` or ``/run/testbed`` (rootless: on the user's private
tmpfs): on tmpfs, like the namespace handles, so it vanishes at reboot (or with the
rootless holder) together with the namespaces it describes.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path
from typing import Iterator

from testbed.common import rootless
from testbed.common.errors import StateError, TestbedError
from testbed.common.files import private_dir
from testbed.common.locks import held, open_lock


def state_root() -> Path:
    """``$TESTBED_STATE_DIR``, else ``/run/testbed`` as root, else (rootless) the state
    directory on the user's private tmpfs, which only the user's own commands see."""
    if os.environ.get("TESTBED_STATE_DIR"):
        return Path(os.environ["TESTBED_STATE_DIR"])
    return rootless.private_root() / "state" if rootless.active() else Path("/run/testbed")


STATE_HINT = "set TESTBED_STATE_DIR to a directory of yours (or unset it), or run as root"


def check_root() -> Path:
    """The state directory, refused in one line (a StateError) when this user cannot use it:
    not a directory, or not readable, writable and searchable (a testbed made in a
    directory that cannot be listed could never be found again). One that does not exist
    yet is made when first needed: its nearest existing parent must let us."""
    root = state_root()
    for d in (root, *root.parents):
        try:
            st = os.stat(d)
        except FileNotFoundError:
            continue
        except OSError as e:
            raise StateError(f"cannot use the state directory {root}: {d}: {e.strerror}", STATE_HINT) from None
        if not stat.S_ISDIR(st.st_mode):
            raise StateError(f"cannot use the state directory {root}: {d} is not a directory", STATE_HINT)
        need = os.R_OK | os.W_OK | os.X_OK if d == root else os.W_OK | os.X_OK
        if not os.access(d, need):
            why = f"the state directory {root} is not readable, writable and searchable by you" if d == root \
                else f"cannot make the state directory {root}: {d} is not writable by you"
            raise StateError(why, STATE_HINT)
        return root
    return root


@contextlib.contextmanager
def global_lock(timeout: float = 120.0) -> Iterator[None]:
    """Serialise what concerns every testbed of this state directory across processes: an
    up's check and reservation of its name (its ledger made; the build then holds the
    testbed's own lock, :meth:`testbed.plan.ledger.Ledger.lock`), a host agent's the same, and
    down --all. A testbed's down, link changes and trace steps take its own lock only, so a
    VM testbed booting holds up no other testbed. Whoever holds this lock takes a testbed's
    after it, never the other way round (testbed.common.locks)."""
    root = state_root()
    try:
        private_dir(root)
        fd = open_lock(root / ".lock")
    except PermissionError:
        raise TestbedError(f"cannot write the state directory {root}",
                           "set TESTBED_STATE_DIR to a directory of yours, or run as root") from None
    with held(fd, timeout, "another testbed command holds the lock"):
        yield


