"""Files that may come from someone else: data sets and checkpoints read, the checkpoint written.

A lab machine is shared: a ``--data-dir`` or a checkpoint may sit where another user can
write, and a rank may run as root. Nothing read here may run code or block, and nothing
written here may follow a link someone planted (docs/security.md):

* :func:`open_checked` / :func:`open_bounded`: a regular file only (a FIFO does not block,
  a device is refused), of at most ``limit`` bytes (:class:`Bounded`: even if it grows
  while read).
* :func:`load_cifar_pickle`: a restricted unpickler admitting only what the CIFAR python
  release holds (dicts, lists, bytes, str, numbers, numpy arrays of plain dtypes);
  anything else (``os.system``, ``builtins.exec``, an object array) is :class:`Refused`
  before it is called. (Workloads never import testbed: this is the workloads' own
  counterpart of ``testbed.common.files``' bounded readers.)
* :func:`sha256_of`: a file's content hash, read in chunks.
* :func:`check_directory` / :func:`write_replacing`: a file written to a fresh temporary
  name (``O_CREAT|O_EXCL|O_NOFOLLOW``, mode 0600, random), fsync'd, then renamed over the
  destination (a rename replaces a planted link, never writes through it), in a directory
  that is ours or that nobody else can write.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import pickle
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path

MiB = 1 << 20
CIFAR_FILE_LIMIT = 512 * MiB
"""The largest CIFAR python file, cifar-100-python/train, is 155 MB."""


def _size(n: int) -> str:
    return f"{n // MiB} MiB" if n >= MiB else f"{n:,} bytes"


class Refused(ValueError):
    """A file that is not what it should be; the message says what it holds or is."""


def _kind_of(mode: int) -> str:
    for test, name in ((stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"),
                       (stat.S_ISFIFO, "FIFO"), (stat.S_ISSOCK, "socket"), (stat.S_ISDIR, "directory")):
        if test(mode):
            return name
    return "special file"


class Bounded(io.RawIOBase):
    """A raw readable file that fails (:class:`Refused`) past ``limit`` bytes (read it
    through ``io.BufferedReader``, as :func:`open_bounded` does)."""

    def __init__(self, f, limit: int):
        super().__init__()
        self._f, self._left, self.limit = f, limit, limit

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        view = memoryview(b).cast("B")
        n = self._f.readinto(view[:min(len(view), self._left + 1)])
        self._left -= n
        if self._left < 0:
            raise Refused(f"it is larger than {_size(self.limit)}")
        return n

    def close(self) -> None:
        self._f.close()
        super().close()


def open_checked(path: str | Path, limit: int):
    """``path`` opened for binary reading (not blocking on a FIFO, not taking a terminal);
    :class:`Refused` unless it is a regular file of at most ``limit`` bytes now.
    FileNotFoundError and other OSErrors pass."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Refused(f"it is a {_kind_of(st.st_mode)}, not a regular file")
        if st.st_size > limit:
            raise Refused(f"it is {st.st_size:,} bytes, more than the {_size(limit)} it may be")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def open_bounded(path: str | Path, limit: int) -> io.BufferedReader:
    """:func:`open_checked`, read through :class:`Bounded` (it may grow while read)."""
    return io.BufferedReader(Bounded(open_checked(path, limit), limit), buffer_size=1 * MiB)


# ---------------------------------------------------------------- CIFAR batches
def _latin1(text, encoding):
    """``_codecs.encode`` as Python 3's protocol-2 pickles of bytes use it (latin-1 only:
    another codec could make a small file expand)."""
    if not isinstance(text, str) or str(encoding).lower().replace("-", "").replace("_", "") != "latin1":
        raise Refused(f"it encodes with {encoding!r}, which a CIFAR batch never does")
    return text.encode("latin-1")


def _admitted() -> dict[tuple[str, str], object]:
    """The globals a numpy array's pickle names (numpy 1 writes ``numpy.core``, numpy 2
    ``numpy._core``; real CIFAR files are numpy 1 arrays pickled by Python 2)."""
    import numpy as np

    numpy_reconstruct = np.ndarray((0,), np.uint8).__reduce__()[0]
    scalar = np.uint8(0).__reduce__()[0]

    def reconstruct(subtype, shape, dtype):
        """An empty array that the pickle's state then fills (numpy pickles ``(0,)``): a
        shape of terabytes would be allocated here, before any data is read."""
        if subtype is not np.ndarray or not isinstance(shape, tuple) or len(shape) != 1 or shape[0] not in (0, 1):
            raise Refused(f"it reconstructs an array as {shape!r}, which numpy's own pickles never do")
        return numpy_reconstruct(subtype, shape, dtype)

    def dtype(spec, align=False, copy=False):
        try:
            dt = np.dtype(spec, align, copy)
        except (TypeError, ValueError) as e:
            raise Refused(f"it holds a dtype numpy refuses ({e})") from None
        if dt.hasobject:
            raise Refused("it holds an array of Python objects, which a CIFAR batch never does")
        if dt.kind not in "biufc" or dt.itemsize > 16:  # numbers only: no records, no void of a gigabyte
            raise Refused(f"it holds an array of dtype {dt}, which a CIFAR batch never does")
        return dt

    admitted: dict[tuple[str, str], object] = {("numpy", "ndarray"): np.ndarray, ("numpy", "dtype"): dtype,
                                               ("_codecs", "encode"): _latin1}
    for mod in ("numpy.core.multiarray", "numpy._core.multiarray"):
        admitted[(mod, "_reconstruct")] = reconstruct
        admitted[(mod, "scalar")] = scalar
    return admitted


class _CifarUnpickler(pickle.Unpickler):
    def __init__(self, file, admitted):
        super().__init__(file, encoding="bytes")
        self._admitted = admitted

    def find_class(self, module: str, name: str):
        try:
            return self._admitted[(module, name)]
        except KeyError:
            raise Refused(f"it names {module}.{name}, which a CIFAR batch never holds") from None

    def persistent_load(self, pid):
        raise Refused("it holds a persistent reference, which a CIFAR batch never does")


def load_cifar_pickle(path: str | Path, limit: int = CIFAR_FILE_LIMIT):
    """The object a CIFAR python-release file holds; :class:`Refused` (what it holds or is)
    when it names anything else, or is no regular file of at most ``limit`` bytes.
    Truncated or foreign files raise what the unpickler raises."""
    admitted = _admitted()
    with open_bounded(path, limit) as f:
        obj = _CifarUnpickler(f, admitted).load()
    return obj


# ---------------------------------------------------------------- hashes and writes
def sha256_of(f, chunk: int = 4 * MiB) -> str:
    """The sha256 (hex) of what is left to read in the binary file ``f``."""
    h = hashlib.sha256()
    while block := f.read(chunk):
        h.update(block)
    return h.hexdigest()


def check_directory(directory: str | Path) -> None:
    """:class:`Refused` when ``directory`` belongs to someone else and others than its owner
    may write to it (``/tmp``, a group-writable share), or when another user may rename a
    folder above it (:func:`_check_above`): another user could swap what we put there. A
    missing directory passes (we create it, ours); the folders above it are checked."""
    for above in Path(os.path.realpath(directory)).parents:
        _check_above(above)
    try:
        st = os.stat(directory)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        raise Refused(f"{directory} is not a directory")
    if st.st_uid != os.geteuid() and st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        who = "everyone" if st.st_mode & stat.S_IWOTH else f"group {st.st_gid}"
        raise Refused(f"{directory} belongs to uid {st.st_uid} and {who} may write to it: another user "
                      f"could replace the file there")


def _check_above(folder: Path) -> None:
    """:class:`Refused` when another user may rename what is in ``folder``, a folder above
    where we write: its owner is neither root nor us (an owner can always chmod), or all may
    write it and it is not sticky. testbed's own writers see through its rootless namespaces
    (testbed.common.owners); a rank cannot, so there an owner shown as the overflow uid
    counts as root's where only that owner may write the folder."""
    try:
        st = os.stat(folder)
    except FileNotFoundError:
        return
    open_to_all = bool(st.st_mode & stat.S_IWOTH)
    trusted = {0, os.geteuid()} | ({65534} if _in_user_namespace() and not open_to_all else set())
    if st.st_uid not in trusted or (open_to_all and not st.st_mode & stat.S_ISVTX):
        raise Refused(f"{folder} belongs to uid {st.st_uid} (mode {stat.S_IMODE(st.st_mode):o}): another user "
                      "may rename what is in it and swap the file we write below it")


def _in_user_namespace() -> bool:
    try:
        with open("/proc/self/uid_map", "rb") as f:
            return f.read(4096).split(b"\n", 1)[0].split() != [b"0", b"0", b"4294967295"]
    except OSError:
        return False


def write_replacing(path: str | Path, write: Callable[[io.BufferedWriter], None]) -> None:
    """Write ``path`` through ``write(f)`` on a fresh temporary file beside it (random name,
    ``O_EXCL|O_NOFOLLOW``, 0600), fsync'd, renamed over ``path`` (a link planted there is
    replaced, not followed), the directory fsync'd. :class:`Refused` for a directory of
    :func:`check_directory`'s kind; OSErrors pass (the temporary file removed)."""
    path = Path(path)
    check_directory(path.parent)
    path.parent.mkdir(parents=True, exist_ok=True)
    check_directory(path.parent)  # made in the meantime by someone else
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)

