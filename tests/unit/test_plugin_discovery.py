"""Entry-point discovery as hostile input (workloads.entrypoints; the review of issue 59's
plugins): a package planted in the working directory is not loaded, a package's broken
metadata is one warning, and a plugin's texts reach a warning line printable."""

from __future__ import annotations

import sys

from workloads import entrypoints

PLANTED = "[testbed.backends]\nevil = evilmod:Backend\n"


def _plant(where, entry_points: str = PLANTED) -> None:
    info = where / "evil-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: evil\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(entry_points)
    (where / "evilmod.py").write_text("open('MARKER', 'w').write('imported')\n")


def test_a_package_in_the_working_directory_is_not_loaded(tmp_path, monkeypatch):
    _plant(tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))  # as `python -m` puts it first
    warnings: list[str] = []
    assert entrypoints.installed("testbed.backends", warnings) == []
    assert warnings == ["plugin 'evil' of testbed.backends in the working directory is skipped: only installed "
                        "packages are loaded"]
    assert not (tmp_path / "MARKER").exists()


def test_an_installed_package_elsewhere_is_found(tmp_path, monkeypatch):
    site = tmp_path / "site"
    site.mkdir()
    _plant(site)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.chdir(tmp_path)
    warnings: list[str] = []
    assert [ep.name for ep in entrypoints.installed("testbed.backends", warnings)] == ["evil"] and warnings == []


def test_broken_metadata_is_a_warning_and_texts_are_printable(tmp_path, monkeypatch):
    site = tmp_path / "site"
    site.mkdir()
    _plant(site, "[testbed.backends]\nevil\n")  # no "= VALUE": importlib.metadata raised TypeError
    monkeypatch.syspath_prepend(str(site))
    warnings: list[str] = []
    found = entrypoints.installed("testbed.backends", warnings)
    assert found == [] and len(warnings) == 1 and "could not be read" in warnings[0], warnings
    assert entrypoints.printable("a\x1b]0;owned\x07b\x1b[31m") == "a?]0;owned?b?[31m"
    assert sys.modules.get("evilmod") is None
