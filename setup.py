"""The commit a built package was made from, written into it (``testbed/COMMIT``).

Everything else is in pyproject.toml. An installed copy (a wheel, ``pip install .``) is not
a git checkout, so ``testbed.runs.rundir.code_version`` reads the commit from this file
instead of asking git, which in a venv inside some other checkout would name that one's.
An editable install reads its checkout's git itself and gets no file; a build from an
sdist, with no git, gets none either (its runs then say "unknown")."""

import os
import re
import subprocess
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
HEX = re.compile(r"[0-9a-f]{40}")


def commit() -> str | None:
    """This checkout's HEAD; None when HERE is no checkout's top (an sdist, or one inside some
    other repository: git is not let search above HERE) or git cannot say."""
    if not (HERE / ".git").exists():
        return None
    try:
        r = subprocess.run(["git", "-C", str(HERE), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10,
                           env={**os.environ, "GIT_CEILING_DIRECTORIES": str(HERE.parent)})
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = r.stdout.strip()
    return found if r.returncode == 0 and HEX.fullmatch(found) else None


class BuildWithCommit(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return  # the checkout itself is imported: its git answers
        out = Path(self.build_lib) / "testbed" / "COMMIT"
        out.unlink(missing_ok=True)  # setuptools reuses build/: never ship an earlier build's commit
        found = commit()
        if found:
            fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
            with os.fdopen(fd, "w") as f:
                f.write(found + "\n")


setup(cmdclass={"build_py": BuildWithCommit})
