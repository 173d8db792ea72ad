"""Directories testbed writes results into, safe where other users can write too.

A report goes into a folder beside the runs it reads, a sweep or a run into ``--out``: places
another user of the machine may have prepared (a ``report/`` folder of theirs, a symlink
named like our file, a link swapped in between a check and a write). :class:`OutDir` holds
the directory by a descriptor once it is checked to be ours, and writes every file in it
under a fresh random name created with ``O_EXCL | O_NOFOLLOW`` (never through a link, never
into a file that exists), then renames it over the final name *within that descriptor*
(which replaces a planted link rather than following it).

The directory itself must be owned by the user and not writable by all, and every folder
above it must be one the user or root owns, and sticky where all may write it (like
``/tmp``): another user who may rename a folder above could swap what we write
(:func:`testbed.common.owners.check_above`, which also sees through the rootless
namespaces). A directory's group is trusted with it, as the file system trusts it (a
project's shared folder, or Debian's private group of one). Refusals are one
:class:`~testbed.common.errors.TestbedError` line naming the directory and the way out
(``--out`` a directory of one's own).
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import secrets
import stat
from pathlib import Path
from typing import BinaryIO, Iterator

from testbed.common.owners import UnsafeDirectory, check_above, who
from testbed.common.writes import writing

PRIVATE = 0o700


def _check_dir(path: Path, fd: int, flag: str) -> None:
    st = os.fstat(fd)
    if st.st_uid != os.geteuid():
        raise UnsafeDirectory(f"{path} belongs to {who(st.st_uid)}, not to you: testbed writes only into "
                              "directories you own", f"{flag} a directory of your own")
    if st.st_mode & 0o002:
        raise UnsafeDirectory(f"{path} is writable by other users (mode {stat.S_IMODE(st.st_mode):o}), who could "
                              "plant links where testbed writes", f"`chmod o-w {path}`, or {flag} another directory")


class OutDir:
    """``path`` made (``mode``, parents too) or reused when it is safely ours, held open."""

    def __init__(self, path: Path, flag: str = "--out", mode: int = PRIVATE, fresh: bool = False):
        self.path, self.flag = Path(os.path.abspath(path)), flag
        parent = self.path.parent
        check_above(self.path, flag)  # before anything is made below an unsafe folder
        with writing(parent):
            parent.mkdir(parents=True, exist_ok=True)
        pfd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self.fd = -1
        try:
            there = self._exists(pfd)
            if there and fresh:
                raise UnsafeDirectory(f"{self.path} already exists", f"{flag} a new directory")
            if not there:  # the folders above first: nothing is made under one that is not safe
                check_above(self.path, flag)
                self._make(pfd)
            self.fd = self._open(pfd)
            _check_dir(self.path, self.fd, flag)  # a folder someone else made says so first
            if there:
                check_above(self.path, flag)
            else:
                os.fchmod(self.fd, mode)  # whatever the umask
        except BaseException:
            self.close()
            raise
        finally:
            os.close(pfd)

    def _open(self, pfd: int) -> int:
        """The directory, held; a symlink only when it is the user's own (in a parent checked
        above, no one else could have made it but root)."""
        flags = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
        try:
            return os.open(self.path.name, flags | os.O_NOFOLLOW, dir_fd=pfd)
        except OSError as e:
            st = os.lstat(self.path.name, dir_fd=pfd) if e.errno in (errno.ELOOP, errno.ENOTDIR) else None
            if st is None or not stat.S_ISLNK(st.st_mode) or st.st_uid != os.geteuid():
                why = (e.strerror if st is None else f"a link of uid {st.st_uid}"
                       if stat.S_ISLNK(st.st_mode) else "a file")
                raise UnsafeDirectory(f"{self.path} is not a directory of yours ({why})",
                                      f"remove it, or {self.flag} another directory") from None
        try:
            return os.open(self.path.name, flags, dir_fd=pfd)
        except OSError as e:
            raise UnsafeDirectory(f"{self.path} links to no directory ({e.strerror})",
                                  f"{self.flag} another directory") from None

    def _exists(self, pfd: int) -> bool:
        try:
            os.lstat(self.path.name, dir_fd=pfd)
            return True
        except FileNotFoundError:
            return False

    def _make(self, pfd: int) -> None:
        try:
            with writing(self.path):
                os.mkdir(self.path.name, PRIVATE, dir_fd=pfd)
        except FileExistsError:  # made meanwhile: opened and checked like any other
            pass

    def close(self) -> None:
        if getattr(self, "fd", -1) >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> "OutDir":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def open_log(self, name: str) -> BinaryIO:
        """``name`` in this directory, opened to be written as it grows (a process's stdout):
        made 0600 or emptied when it is a file, never followed when it is a link."""
        if "/" in name or name in ("", ".", ".."):
            raise ValueError(f"not a plain file name: {name!r}")
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
        with writing(self.path / name):
            return os.fdopen(os.open(name, flags, 0o600, dir_fd=self.fd), "wb")

    @contextlib.contextmanager
    def create(self, name: str, kept: str = "") -> Iterator[BinaryIO]:
        """A new file ``name`` in this directory, written in binary; it appears whole, by a
        rename within the directory, when the block ends without error."""
        if "/" in name or name in ("", ".", ".."):
            raise ValueError(f"not a plain file name: {name!r}")
        tmp = f".{name}.{secrets.token_hex(8)}.tmp"
        with writing(self.path / name, kept):
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                         dir_fd=self.fd)
            try:
                with os.fdopen(fd, "wb") as f:
                    yield f
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp, dir_fd=self.fd)
                raise

    @contextlib.contextmanager
    def create_text(self, name: str, kept: str = "") -> Iterator[io.TextIOWrapper]:
        """:meth:`create` as UTF-8 text (newlines as written: fit for :mod:`csv`)."""
        with self.create(name, kept) as f:
            text = io.TextIOWrapper(f, encoding="utf-8", newline="")
            yield text
            text.flush()
            text.detach()

    def write_bytes(self, name: str, data: bytes, kept: str = "") -> None:
        with self.create(name, kept) as f:
            f.write(data)

    def write_text(self, name: str, text: str, kept: str = "") -> None:
        self.write_bytes(name, text.encode("utf-8"), kept)


def own_dir(path: Path, flag: str = "--out", fresh: bool = False) -> Path:
    """``path`` made private, or checked to be safely the user's, as :class:`OutDir` does,
    for writers that then write in it by path (a directory no one else can write in)."""
    OutDir(path, flag, fresh=fresh).close()
    return path
