"""Per-testbed state on disk: the write-ahead ledger, a description, and a global lock.

``<state dir>/<name>/ledger.jsonl``
    One JSON object per line, appended and fsync'd *before* the kernel object it names is
    created. ``down`` undoes exactly what is listed, in reverse, tolerating "already gone".
    A torn last line (crash mid-write) is ignored: its object was never created.
``<state dir>/<name>/state.json``
    What ``status``, ``link`` and ``exec`` need from another process: topology, node
    table (namespace, interface, address), egress map, current shapes, ``ready`` flag.
    Replaced atomically.

The state dir is ``$TESTBED_STATE_DIR`` or ``/run/testbed``: on tmpfs, like ``/run/netns``,
so it vanishes at reboot together with the namespaces it describes.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil

from testbed.common.errors import StateError
from testbed.common.files import private_dir, read_json, read_text
from testbed.common.locks import held, open_lock
from testbed.common.state import state_root


class Ledger:
    def __init__(self, name: str):
        from testbed.model.topology import check_testbed_name

        # the name becomes a path under the state directory: validated like a YAML name
        # (no separators, no '..', no trailing newline, not a folder of the state dir)
        self.name = check_testbed_name(name, "testbed name")
        self.dir = state_root() / name
        self.path = self.dir / "ledger.jsonl"
        self.state_path = self.dir / "state.json"
        self._fd: int | None = None

    # ----------------------------------------------------------- discovery
    @staticmethod
    def all_names() -> list[str]:
        root = state_root()
        if not root.is_dir():
            return []
        from testbed.model.topology import NAME_RE, RESERVED_NAMES

        return sorted(p.name for p in root.iterdir() if p.is_dir() and NAME_RE.fullmatch(p.name)
                      and p.name not in RESERVED_NAMES and (p / "ledger.jsonl").exists())

    def exists(self) -> bool:
        return self.path.exists()

    def mark_going(self, going: bool = True) -> None:
        """Say (or unsay) that `down` is taking this testbed away, for the runs on it to tell
        their users why their ranks were stopped."""
        marker = self.dir / "going-down"
        if going:
            marker.touch(mode=0o600)
        else:
            marker.unlink(missing_ok=True)

    def going(self) -> bool:
        """Whether this testbed is being, or has been, taken down."""
        return not self.path.exists() or (self.dir / "going-down").exists()

    def lock(self, timeout: float = 120.0):
        """This testbed's lock (its links, its ledger), not the state directory's: another
        testbed's up, down or trace steps never wait for it. ``down`` takes it after the
        global lock. A StateError when the testbed is not up (no directory to lock in)."""
        try:
            fd = open_lock(self.dir / ".lock")
        except (FileNotFoundError, NotADirectoryError):
            raise StateError(f"testbed '{self.name}' is not up", "`testbed status` lists those that are") from None
        return held(fd, timeout, f"another command is changing testbed '{self.name}'")

    # ----------------------------------------------------------- writing
    def create(self) -> None:
        """Start a new ledger; refuses if one exists (the name is up or half up)."""
        private_dir(state_root())
        private_dir(self.dir)
        try:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o600)
        except FileExistsError:
            raise StateError(f"testbed '{self.name}' is already up (or a previous up did not finish)",
                             f"run `testbed down {self.name}` first, or use another name") from None

    def record(self, *entries: dict) -> None:
        """Append entries durably (one write, one fsync) before the objects exist."""
        if self._fd is None:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW)
        data = memoryview("".join(json.dumps(e, separators=(",", ":")) + "\n" for e in entries).encode())
        while data:  # a short write (full disk, signal) must not leave an entry unrecorded
            n = os.write(self._fd, data)
            if n <= 0:
                raise StateError(f"cannot append to the ledger {self.path}", "is the disk full?")
            data = data[n:]
        os.fsync(self._fd)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    # ----------------------------------------------------------- reading
    def entries(self, problems: list[str] | None = None) -> list[dict]:
        """The recorded entries. A torn last line (a crash mid-write: its action never ran)
        is dropped; a bad line before others is reported in ``problems`` and skipped, so
        it cannot hide the entries after it."""
        out = []
        try:
            text = read_text(self.path, "state", "ledger")
        except FileNotFoundError:
            return []
        lines = text.split("\n")
        for i, line in enumerate(lines):
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
            except (ValueError, RecursionError):  # not JSON, a number past int's digit limit, deep nesting
                entry = None
            if isinstance(entry, dict):
                out.append(entry)
                continue
            last = i == len(lines) - 1 or all(not x.strip() for x in lines[i + 1:])
            if not last and problems is not None:
                problems.append(f"ledger line {i + 1} is damaged and was skipped: {line[:60]!r}")
        return out

    def read_state(self) -> dict | None:
        """The state file's mapping; None when there is none, or it is damaged (not JSON,
        nested too deeply, not a mapping): :meth:`state_damaged` tells which."""
        try:
            state = read_json(self.state_path, "state", "state file")
        except (FileNotFoundError, ValueError, RecursionError):  # JSONDecodeError is a ValueError
            return None
        return state if isinstance(state, dict) else None

    def state_damaged(self) -> bool:
        """A state file exists beside the ledger, but :meth:`read_state` cannot read it."""
        return self.exists() and self.state_path.exists() and self.read_state() is None

    def write_state(self, state: dict, durable: bool = True) -> None:
        """``durable`` False: a trace step's (see :func:`testbed.common.files.atomic_write`).
        One line of JSON: the C encoder writes a 64-worker state in about 1 ms, the indenting
        pure-Python one took 8 ms of every trace step."""
        from testbed.common.files import write_json

        private_dir(state_root())
        private_dir(self.dir)
        write_json(self.state_path, state, indent=None, durable=durable)

    def remove(self) -> None:
        """The testbed's directory gone: renamed away at once (the name is free from that
        moment: an `up` of the same name, which the global lock does not keep out any more,
        makes its directory afresh), then removed."""
        self.close()
        trash = self.dir.with_name(f".{self.name}.removed-{secrets.token_hex(4)}")  # no testbed's name
        try:
            os.rename(self.dir, trash)
        except FileNotFoundError:
            return
        shutil.rmtree(trash, ignore_errors=True)
