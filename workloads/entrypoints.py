"""Entry points of installed packages (plugins), read as hostile input.

Only distributions installed in a site directory count: one found in the working directory
(``python -m`` puts it first on ``sys.path``) is skipped, so a folder another user prepared
with a planted ``*.dist-info`` cannot make testbed import its code. A broken metadata file
of any package is a warning, not a traceback, and every text of a plugin that reaches a
warning line is made printable (no terminal escapes)."""

from __future__ import annotations

import os
from importlib.metadata import EntryPoint, entry_points


def printable(text: object, limit: int = 200) -> str:
    """``text`` with every non-printable character (an escape sequence's ESC) as ``?``."""
    s = str(text)[:limit]
    return "".join(c if c.isprintable() else "?" for c in s)


def package(ep: EntryPoint) -> str:
    """The name of the installed package that declares ``ep``, printable."""
    return printable(ep.dist.name if ep.dist is not None else "?")


def _from_here(ep: EntryPoint) -> bool:
    """Whether ``ep``'s distribution lies in the working directory (where ``python -m``'s
    first ``sys.path`` entry points)."""
    dist = ep.dist
    if dist is None:
        return False
    try:
        return os.path.realpath(str(dist.locate_file(""))) == os.path.realpath(os.getcwd())
    except (OSError, ValueError):
        return True  # no working directory to compare with: not loaded


def installed(group: str, warnings: list[str]) -> list[EntryPoint]:
    """The entry points of ``group`` that installed packages declare; what is skipped is a
    line in ``warnings``."""
    try:
        found = list(entry_points(group=group))
    except Exception as e:  # noqa: BLE001 - a package's malformed entry_points.txt: every command would fail
        warnings.append(f"the installed packages' entry points ({group}) could not be read: "
                        f"{type(e).__name__}: {printable(e)}")
        return []
    out = []
    for ep in found:
        if _from_here(ep):
            warnings.append(f"plugin {printable(ep.name)!r} of {group} in the working directory is skipped: only "
                            "installed packages are loaded")
        else:
            out.append(ep)
    return out
