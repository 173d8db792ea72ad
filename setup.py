"""The commit a built package was made from, written into it (``testbed/COMMIT``).

Everything else is in pyproject.toml. An installed copy (a wheel, ``pip install .``) is not
a git checkout, so ``testbed.runs.rundir.code_version`` reads the commit from this file
instead of asking git, which in a venv inside some other checkout would name that one's.
An editable install reads its checkout's git itself and gets no file; a build from an
sdist, with no git, gets none either (its runs then say "unknown")."""

import subprocess
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent


def commit() -> str | None:
    try:
        r = subprocess.run(["git", "-C", str(HERE), "rev-parse", "--show-toplevel", "HEAD"], capture_output=True,
                           text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = r.stdout.split()
    if r.returncode != 0 or len(lines) != 2 or Path(lines[0]).resolve() != HERE:
        return None  # no checkout of its own (an sdist unpacked inside another repository)
    return lines[1]


class BuildWithCommit(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return  # the checkout itself is imported: its git answers
        found = commit()
        if found:
            out = Path(self.build_lib) / "testbed" / "COMMIT"
            out.write_text(found + "\n")


setup(cmdclass={"build_py": BuildWithCommit})
