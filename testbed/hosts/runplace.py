"""A run's directory as the ranks on one host see it (:meth:`testbed.hosts.site.Site.open_run`).

:class:`LocalRun`: the run directory itself, mounted into the nodes (a container sees it
at the same path), ranks started by the node's backend with the backend's environment
and GPU numbering. :class:`RemoteRun`: that host's own directory of the run (``testbed
_host rundir``), its inputs uploaded and what the ranks write copied back, incrementally,
over SFTP; ranks relayed over SSH, their environment set up by that host's testbed.
:class:`CodeTree`: the user's own code (``testbed run --script`` / ``-m``), copied into that
host's run directory as ``code/`` (bounded) and its paths in the ranks' arguments mapped there.
"""

from __future__ import annotations

import os
import stat as st
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from testbed.common import procs
from testbed.common.errors import TestbedError


MAX_CODE_FILES = 2000
MAX_CODE_BYTES = 256 << 20
SKIPPED = ("__pycache__", ".git", ".venv", "venv", "node_modules")


@dataclass(frozen=True)
class CodeTree:
    """What of the user's code another host needs: ``entries`` (files or directories) under
    ``root``, copied with ``root``'s layout; ``skip``: directories never copied (the runs' own
    output directory when it lies inside)."""

    root: Path
    entries: tuple[Path, ...]
    skip: tuple[Path, ...] = ()

    def files(self) -> list[tuple[Path, int]]:
        """(file, size) of everything to copy, hidden names and outputs left out; bounded."""
        out, total = [], 0
        for entry in self.entries:
            for f in ([entry] if entry.is_file() else sorted(self._walk(entry))):
                size = f.stat().st_size
                total += size
                out.append((f, size))
                if len(out) > MAX_CODE_FILES or total > MAX_CODE_BYTES:
                    raise TestbedError(f"your code's directory {self.root} holds more than {MAX_CODE_FILES} files "
                                       f"or {MAX_CODE_BYTES >> 20} MiB, too much to copy to every host",
                                       "put the script in a directory of its own, and its data at a path "
                                       "present on every host")
        return out

    def _walk(self, top: Path):
        for dirpath, dirs, names in os.walk(top):
            d = Path(dirpath)
            dirs[:] = [x for x in dirs if not x.startswith(".") and x not in SKIPPED and d / x not in self.skip
                       and not (d / x / "run.json").exists() and not (d / x / "sweep.json").exists()]
            yield from (d / n for n in names if not n.startswith(".") and (d / n).is_file()
                        and not (d / n).is_symlink())  # a link may point anywhere: not copied


class RunPlace(ABC):
    where = ""
    """How a failure names the host: empty here, `` on host NAME`` elsewhere."""

    @abstractmethod
    def host_gpus(self, backend, gpus: Sequence[int]) -> Sequence[int]:
        """The GPUs a worker without ``gpu:`` may share, round-robin by rank."""

    @abstractmethod
    def environment(self, backend, info, gpu: int | None) -> tuple[dict[str, str], str | None]:
        """A rank's base environment, and CUDA_VISIBLE_DEVICES as the node numbers its GPUs
        (None: the host index ``gpu``)."""

    @abstractmethod
    def command(self, backend, info, argv: Sequence[str], env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
        """The argv and environment of this process's child that runs rank ``info``:
        ``argv`` is MODULE ARGS, ``env`` the rank's environment."""

    def collect(self) -> None:
        """Bring what the ranks wrote so far into the run directory."""


class LocalRun(RunPlace):
    def __init__(self, tb, run_dir: Path, mounts: Sequence[Path]):
        self.tb, self.run_dir, self.mounts = tb, run_dir.resolve(), list(mounts)

    def host_gpus(self, backend, gpus):
        return gpus if backend.shares_host_gpus else ()

    def environment(self, backend, info, gpu):
        return backend.environment(info), backend.cuda_visible(info, gpu)

    def command(self, backend, info, argv, env):
        cmd = self.tb.command(info.name, procs.python_argv(*argv, python=backend.python(info)),
                              mounts=self.mounts, cwd=self.run_dir)
        return cmd, env


class RemoteRun(RunPlace):
    """A run's directory on another host: growing files (records, logs) are copied by their
    appended bytes, replaced ones (summary.json) whole."""

    def __init__(self, site, run_dir: Path, mounts: Sequence[Path], code: CodeTree | None = None):
        self.site, self.host, self.run_dir = site, site.host, run_dir.resolve()
        self.where = f" on host {site.host}"
        self.path = site.remote.call("rundir", site.tb.name, run_dir.name)["path"]
        if not isinstance(self.path, str) or not self.path.startswith("/"):
            raise TestbedError(f"host {self.host} answered rundir with {self.path!r}")
        self._seen: dict[str, tuple[int, float]] = {}
        self._uploaded = {"placement.json"}
        self.mounts = [m for m in (Path(m).resolve() for m in mounts) if m != self.run_dir]
        self.code = code
        if code is not None:
            self.mounts = [m for m in self.mounts if m != code.root]
        try:
            self.sftp = site.remote.open_sftp()
            self.sftp.put(str(self.run_dir / "placement.json"), f"{self.path}/placement.json")
            if code is not None:
                self._put_code(code)
        except TestbedError:
            raise
        except Exception as e:  # paramiko's SFTP and transport errors, a lost connection
            raise site.remote.failure("copying the run's inputs there", e) from None

    def host_gpus(self, backend, gpus):
        return ()

    def environment(self, backend, info, gpu):
        # that host's testbed adds the node's own environment; CUDA_VISIBLE_DEVICES is as the
        # node numbers its GPUs (a container's or a VM's one GPU is 0 there, not its host index)
        return {}, backend.cuda_visible(info, gpu)

    def command(self, backend, info, argv, env):
        env = {k: self.rewrite(v) for k, v in env.items()}
        argv = [self.rewrite(a) for a in argv]
        cmd = self.site.relay(info.name, argv, python=True, run=self.run_dir.name, env=env,
                              mounts=[m for m in self.mounts if str(m) in argv])
        return cmd, dict(os.environ)

    def rewrite(self, arg: str) -> str:
        """A rank's argument or variable as that host sees it: the run directory is its own,
        the user's code its copy, and a file of a mounted directory (a checkpoint) is uploaded
        into it first."""
        if arg.startswith(str(self.run_dir)):
            return self.path + arg[len(str(self.run_dir)):]
        code = self.code  # the code's directory, and paths inside what was copied of it
        if code is not None and (arg == str(code.root) or any(arg == str(e) or arg.startswith(f"{e}/")
                                                              for e in code.entries)):
            return f"{self.path}/code" + arg[len(str(code.root)):]
        p = Path(arg)
        if p.is_absolute() and p.is_file() and any(m in p.parents for m in self.mounts):
            name = f"input-{len(self._uploaded)}-{p.name}"
            self.sftp.put(str(p), f"{self.path}/{name}")
            self._uploaded.add(name)
            return f"{self.path}/{name}"
        return arg

    def _put_code(self, code: CodeTree) -> None:
        """The code's files into ``code/`` of that host's run directory, with their layout."""
        files = code.files()  # bounded before anything is copied
        self.sftp.mkdir(f"{self.path}/code")
        made = {"."}
        for f, _ in files:
            rel = f.relative_to(code.root)
            for parent in reversed(rel.parents):
                if str(parent) not in made:
                    self.sftp.mkdir(f"{self.path}/code" + ("" if str(parent) == "." else f"/{parent}"))
                    made.add(str(parent))
            self.sftp.put(str(f), f"{self.path}/code/{rel}")

    def collect(self) -> None:
        try:
            self._collect()
        except (OSError, EOFError) as e:  # also paramiko's SFTP errors (IOError) and a lost connection
            raise self.site.remote.failure("copying the run's files back", e) from None

    def _collect(self) -> None:
        for a in self.sftp.listdir_attr(self.path):
            if a.filename in self._uploaded or not st.S_ISREG(a.st_mode or 0) or a.filename.endswith(".tmp"):
                continue
            key = (a.st_size or 0, a.st_mtime or 0)
            if self._seen.get(a.filename) != key:
                self._fetch(a.filename, a.st_size or 0)
                self._seen[a.filename] = key

    def _fetch(self, name: str, size: int) -> None:
        local = self.run_dir / name
        have = local.stat().st_size if local.exists() else 0
        growing = name.endswith((".jsonl", ".log")) and size >= have
        with self.sftp.open(f"{self.path}/{name}", "rb") as src:
            if growing:
                src.seek(have)
                data = src.read()
                with open(local, "ab") as f:
                    f.write(data)
            else:
                data = src.read()
                tmp = local.with_name(local.name + ".part")
                tmp.write_bytes(data)
                os.replace(tmp, local)
