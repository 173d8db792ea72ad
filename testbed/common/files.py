"""Files testbed reads and writes: private directories, one atomic writer, bounded readers
(whole files, JSON, a log's tail, JSONL records and their live tail).

Every file the tool reads may be hostile (a link to /dev/zero, a FIFO, a sparse file of a
terabyte): readers open it without blocking, refuse anything but a regular file, and read
at most a bound that fits the file's kind, failing with one line that names the file and
the bound (:class:`InputError`).

Records are appended by other processes (ranks) and may end in a line still being
written, or cut short by a crash: readers take complete lines only. State, summaries and
target files are replaced atomically and durably (temporary file, fsync, rename, fsync of
the directory), so a reader never sees half of one and a crash keeps the old or the new.
"""

from __future__ import annotations

import json
import os
import secrets
import stat
from pathlib import Path

from testbed.common.errors import StateError, TestbedError
from testbed.common.owners import UnsafeDirectory, check_above
from testbed.common.writes import writing

MiB = 1 << 20
LIMITS = {"topology": 8 * MiB, "trace": 64 * MiB, "state": 64 * MiB, "json": 16 * MiB, "records": 64 * MiB,
          "key": 1 * MiB, "script": 16 * MiB, "known_hosts": 16 * MiB, "checkpoint": 64 * 1024 * MiB}
"""Bytes read at most, per kind of file (a 1024-worker topology is about 100 KB, its ledger
and state a few MB; records hold a few hundred bytes per iteration)."""
TAIL_BYTES = 64 * 1024
MAX_LINE = 1 * MiB


class InputError(TestbedError):
    """A file the tool reads is not a regular file, or larger than its kind allows."""


def _kind_of(mode: int) -> str:
    for test, name in ((stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"), (stat.S_ISFIFO, "FIFO"),
                       (stat.S_ISSOCK, "socket"), (stat.S_ISDIR, "directory")):
        if test(mode):
            return name
    return "special file"


def open_regular(path: Path, what: str = "file") -> int:
    """A read-only descriptor of ``path`` (not blocking on a FIFO, not taking a terminal),
    refused unless it is a regular file. FileNotFoundError and other OSErrors pass."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise InputError(f"{what} {path} is a {_kind_of(st.st_mode)}, not a regular file",
                         "give a regular file")
    return fd


def check_regular(path: Path, kind: str, what: str = "file") -> None:
    """Refuse ``path`` unless it is a regular file of at most ``LIMITS[kind]`` bytes (for a
    file another library or process reads: SSH keys, checkpoints)."""
    fd = open_regular(path, what)
    try:
        _check_size(path, os.fstat(fd).st_size, kind, what)
    finally:
        os.close(fd)


def _check_size(path: Path, size: int, kind: str, what: str) -> None:
    if size > LIMITS[kind]:
        raise InputError(f"{what} {path} is {size:,} bytes, more than the {LIMITS[kind] // MiB} MiB a {kind} file "
                         "may be", "is it the right file?")


def read_bounded(path: Path, kind: str, what: str = "file") -> bytes:
    """The whole of a regular file of at most ``LIMITS[kind]`` bytes (InputError otherwise)."""
    limit = LIMITS[kind]
    fd = open_regular(path, what)
    with os.fdopen(fd, "rb") as f:
        _check_size(path, os.fstat(fd).st_size, kind, what)
        data = f.read(limit + 1)  # it may grow while read
    if len(data) > limit:
        raise InputError(f"{what} {path} is more than the {limit // MiB} MiB a {kind} file may be",
                         "is it the right file?")
    return data


def read_text(path: Path, kind: str, what: str = "file") -> str:
    """``read_bounded`` as UTF-8 text (undecodable bytes replaced)."""
    return read_bounded(path, kind, what).decode("utf-8", errors="replace")


def read_json(path: Path, kind: str = "json", what: str = "file"):
    """A bounded JSON file; ValueError (json.JSONDecodeError) when it is not JSON."""
    return json.loads(read_bounded(path, kind, what))


def tail_text(path: Path, nbytes: int = TAIL_BYTES) -> str:
    """The last ``nbytes`` of a log ("" when it is missing or not a regular file)."""
    try:
        fd = open_regular(path)
    except (OSError, InputError):
        return ""
    with os.fdopen(fd, "rb") as f:
        size = os.fstat(fd).st_size
        f.seek(max(0, size - nbytes))
        return f.read(nbytes).decode("utf-8", errors="replace")


def private_dir(path: Path) -> Path:
    """Create ``path`` (and parents) readable by its owner only; refuse a symlink or a
    directory someone else owns, where the state of a tool run as root must not live, and
    one below a folder another user may rename in (:func:`testbed.common.owners.check_above`)."""
    try:
        check_above(path, "TESTBED_STATE_DIR:")
    except UnsafeDirectory as e:
        raise StateError(e.message, "set TESTBED_STATE_DIR (or XDG_RUNTIME_DIR) to a directory of yours") from None
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise StateError(f"{path} is not a directory (a symlink?)", "remove it; testbed makes its own")
    if st.st_uid != os.geteuid():
        raise StateError(f"{path} belongs to uid {st.st_uid}, not to us", "remove it, or set TESTBED_STATE_DIR")
    return path


def atomic_write(path: Path, text: str, durable: bool = True) -> None:
    """Replace ``path`` with ``text`` atomically and (``durable``) durably; a full disk or an
    I/O error is a :class:`~testbed.common.writes.WriteFailed` and leaves ``path`` as it was.
    Not ``durable``: atomic for every reader, but a power loss may keep the old content (a
    trace step's shapes, which the kernel loses too)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")  # a fresh name: nothing planted to follow
    kept = f"{path.name} is as it was before" if path.exists() else f"{path.name} was not written"
    with writing(path, kept):
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
                f.flush()
                if durable:
                    os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
    if not durable:
        return
    dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def write_json(path: Path, obj, indent: int | None = 2, durable: bool = True) -> None:
    """``obj`` as JSON, by :func:`atomic_write` (``indent`` None: the C encoder, ~10x faster)."""
    atomic_write(path, json.dumps(obj, indent=indent, default=str) + "\n", durable)


def read_jsonl(path: Path, kind: str = "records") -> list[dict]:
    """Complete records of a JSONL file (bounded by ``LIMITS[kind]``): its JSON objects; a
    line cut short by a crash ends the list; a line that is valid JSON but no object (a
    list, a number), or nested past the parser's depth, is skipped."""
    try:
        data = read_bounded(Path(path), kind, "records file")
    except FileNotFoundError:
        return []
    out = []
    for line in data.splitlines():
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except RecursionError:
            continue
        except ValueError:
            break  # a crash mid-line: keep what came before
        if isinstance(rec, dict):
            out.append(rec)
    return out


class JsonlTail:
    """The complete JSON lines appended to a file since the last :meth:`read`.

    A line still being written waits for the next call; ``last`` is the newest record."""

    def __init__(self, path: Path):
        self.path, self.offset = Path(path), 0
        self.last: dict | None = None
        self.skipped = 0  # complete lines that were no JSON object or nested past the parser's depth

    def read(self) -> list[dict]:
        try:
            fd = open_regular(self.path, "records file")
        except FileNotFoundError:
            return []
        with os.fdopen(fd, "rb") as f:
            f.seek(self.offset)
            chunk = f.read(8 * MiB)  # at most this much per call: the rest next time
        end = chunk.rfind(b"\n") + 1
        if end == 0 and len(chunk) >= MAX_LINE:
            raise InputError(f"records file {self.path} has a line longer than {MAX_LINE // MiB} MiB",
                             "records are one JSON object per line")
        self.offset += end
        out = []
        for line in chunk[:end].splitlines():
            try:
                rec = json.loads(line)
            except (ValueError, RecursionError):
                self.skipped += bool(line.strip())
                continue
            if isinstance(rec, dict):
                out.append(rec)
            else:
                self.skipped += 1
        if out:
            self.last = out[-1]
        return out

    def poll(self) -> dict | None:
        """Read what is new; the newest record so far."""
        self.read()
        return self.last
