"""Where testbed keeps its state: the state directory, private directories, the global lock.

The state dir is ``$TESTBED_STATE_DIR`` or ``/run/testbed`` (rootless: on the user's private
tmpfs): on tmpfs, like the namespace handles, so it vanishes at reboot (or with the
rootless holder) together with the namespaces it describes.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from pathlib import Path
from typing import Iterator

from testbed.common import rootless
from testbed.common.errors import StateError, TestbedError
from testbed.common.files import private_dir


def state_root() -> Path:
    """``$TESTBED_STATE_DIR``, else ``/run/testbed`` as root, else (rootless) the state
    directory on the user's private tmpfs, which only the user's own commands see."""
    if os.environ.get("TESTBED_STATE_DIR"):
        return Path(os.environ["TESTBED_STATE_DIR"])
    return rootless.private_root() / "state" if rootless.active() else Path("/run/testbed")


@contextlib.contextmanager
def global_lock(timeout: float = 120.0) -> Iterator[None]:
    """Serialise mutations (up, down, link set) across processes."""
    root = state_root()
    try:
        private_dir(root)
        fd = os.open(root / ".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    except PermissionError:
        raise TestbedError(f"cannot write the state directory {root}",
                           "set TESTBED_STATE_DIR to a directory of yours, or run as root") from None
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise StateError("another testbed command holds the lock", "wait for it to finish") from None
                time.sleep(0.05)
        yield
    finally:
        os.close(fd)  # closing releases the flock
