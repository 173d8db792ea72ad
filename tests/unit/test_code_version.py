"""Which commit a run names as its code: an installed copy's COMMIT file, a checkout's own
HEAD, never the HEAD of a repository the package merely sits in (a venv inside a checkout)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from testbed.runs.rundir import PACKAGE, code_version


def _repo(path: Path) -> str:
    path.mkdir(parents=True)
    git = ["git", "-C", str(path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    (path / "f").write_text("x")
    subprocess.run([*git, "add", "f"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "x"], check=True)
    return subprocess.run([*git, "rev-parse", "--short=7", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()


def test_a_checkouts_package_names_its_head_and_an_installed_copy_its_commit_file(tmp_path):
    head = _repo(tmp_path / "checkout")
    (tmp_path / "checkout" / "testbed").mkdir()
    assert code_version(tmp_path / "checkout" / "testbed") == head
    installed = tmp_path / "site" / "testbed"
    installed.mkdir(parents=True)
    (installed / "COMMIT").write_text("0123456789abcdef0123456789abcdef01234567\n")
    assert code_version(installed) == "0123456"
    for bad in ("not a commit; rm -rf /\n", "zzzzzzz\n", "0123456" + "x" * 10_000_000):
        (installed / "COMMIT").write_text(bad)
        assert code_version(installed) == "unknown", bad[:20]
    assert code_version(PACKAGE) != "unknown"  # this checkout (editable) answers through git


def test_a_package_inside_someone_elses_checkout_does_not_take_its_head(tmp_path):
    _repo(tmp_path / "project")
    assert code_version(tmp_path / "project" / "src" / "testbed") == "unknown"  # src/ is no checkout's top
    venv_site = tmp_path / "project" / ".venv" / "lib" / "site-packages" / "testbed"
    venv_site.mkdir(parents=True)
    assert code_version(venv_site) == "unknown"
    assert code_version(tmp_path / "nowhere" / "testbed") == "unknown"
