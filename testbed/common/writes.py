"""Writes that can fail for reasons outside the tool: a full disk, a quota, an I/O error.

A run writes records, samples, summaries and logs for minutes or hours; the disk under
``--out`` may fill meanwhile. Such a failure is the user's to fix (free space, another
``--out``), so it reaches them as one line naming the file, the reason and what was kept,
never as a traceback (:class:`WriteFailed`). Writers wrap their I/O in :func:`writing`.
"""

from __future__ import annotations

import contextlib
import errno
import os
from pathlib import Path
from typing import Callable, Iterator, Union

from testbed.common.errors import TestbedError

DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EFBIG, errno.EROFS})
"""What a writer turns into :class:`WriteFailed`: the disk's or the file system's fault, not ours."""


class WriteFailed(TestbedError):
    """Writing ``path`` failed for want of space or by an I/O error; ``kept`` says what of it
    (or of the run) is still there to read."""

    def __init__(self, path: Path, err: OSError, kept: str = ""):
        self.path, self.errno, self.kept = Path(path), err.errno, kept
        reason = _reason(err)
        where = self.path.parent
        super().__init__(
            f"could not write {self.path}: {reason}" + (f"; {kept}" if kept else ""),
            f"free space on the file system of {where} (`df -h {where}`), or write elsewhere (--out)"
            if err.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG) else
            f"the file system of {where} reported an I/O error: check the disk (`dmesg`), or write elsewhere (--out)")


def _reason(e: OSError) -> str:
    """"No space left on device (ENOSPC)"; the error's own text when it carries no errno."""
    if e.errno is None:
        return str(e)
    return f"{os.strerror(e.errno)} ({errno.errorcode.get(e.errno, e.errno)})"


def is_disk_error(e: BaseException) -> bool:
    return isinstance(e, OSError) and e.errno in DISK_ERRNOS


def disk_error(e: OSError) -> TestbedError:
    """A disk error no writer caught, as the user sees it (the file named when known)."""
    return WriteFailed(Path(e.filename), e) if e.filename else TestbedError(
        f"a write failed: {_reason(e)}",
        "free space where testbed writes (--out, the state directory), or check the disk (`dmesg`)")


@contextlib.contextmanager
def writing(path: Path, kept: Union[str, Callable[[], str]] = "") -> Iterator[None]:
    """Turn a disk error inside the block into :class:`WriteFailed` naming ``path``; ``kept``
    (or what it returns, asked only then) says what was kept."""
    try:
        yield
    except OSError as e:
        if e.errno not in DISK_ERRNOS:
            raise
        raise WriteFailed(path, e, kept() if callable(kept) else kept) from None


def free_bytes(path: Path) -> int | None:
    """Bytes an unprivileged writer may still use on the file system holding ``path``."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def nearly_full(path: Path, margin: int = 256 * 1024) -> bool:
    """The file system of ``path`` has less than ``margin`` bytes left (a writer there most
    likely failed for want of space)."""
    free = free_bytes(path)
    return free is not None and free < margin
