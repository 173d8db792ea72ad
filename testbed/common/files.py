"""Files testbed reads and writes: private directories, one atomic writer, one JSONL reader, one JSONL tail.

Records are appended by other processes (ranks) and may end in a line still being
written, or cut short by a crash: readers take complete lines only. State, summaries and
target files are replaced atomically and durably (temporary file, fsync, rename, fsync of
the directory), so a reader never sees half of one and a crash keeps the old or the new.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from testbed.common.errors import StateError


def private_dir(path: Path) -> Path:
    """Create ``path`` (and parents) readable by its owner only; refuse a symlink or a
    directory someone else owns, where the state of a tool run as root must not live."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise StateError(f"{path} is not a directory (a symlink?)", "remove it; testbed makes its own")
    if st.st_uid != os.geteuid():
        raise StateError(f"{path} belongs to uid {st.st_uid}, not to us", "remove it, or set TESTBED_STATE_DIR")
    return path


def atomic_write(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` atomically and durably."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def write_json(path: Path, obj, indent: int | None = 2) -> None:
    atomic_write(path, json.dumps(obj, indent=indent, default=str) + "\n")


def read_jsonl(path: Path) -> list[dict]:
    """Complete records of a JSONL file; a line cut short by a crash ends the list."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    out = []
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except ValueError:
            break  # a crash mid-line: keep what came before
    return out


class JsonlTail:
    """The complete JSON lines appended to a file since the last :meth:`read`.

    A line still being written waits for the next call; ``last`` is the newest record."""

    def __init__(self, path: Path):
        self.path, self.offset, self.last = Path(path), 0, None

    def read(self) -> list[dict]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                chunk = f.read()
        except FileNotFoundError:
            return []
        end = chunk.rfind(b"\n") + 1
        self.offset += end
        out = []
        for line in chunk[:end].splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        if out:
            self.last = out[-1]
        return out

    def poll(self) -> dict | None:
        """Read what is new; the newest record so far."""
        self.read()
        return self.last
