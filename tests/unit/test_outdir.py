"""Writing into directories others may have prepared: never through a link, never into a
directory someone else owns or can write (testbed.common.outdir; the kernel tests repeat the
cases with a second real user)."""

from __future__ import annotations

import os
import stat

import pytest

from testbed.common.outdir import OutDir, UnsafeDirectory


def test_a_new_directory_is_private_and_files_appear_whole(tmp_path):
    old = os.umask(0o002)
    try:
        with OutDir(tmp_path / "a" / "rep") as d:
            d.write_text("x.csv", "1,2\n")
            with d.create_text("y.csv") as f:
                f.write("3\n")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "a" / "rep").stat().st_mode) == 0o700
    assert (tmp_path / "a" / "rep" / "x.csv").read_text() == "1,2\n"
    assert sorted(p.name for p in (tmp_path / "a" / "rep").iterdir()) == ["x.csv", "y.csv"]  # no temporary left


def test_a_planted_link_is_replaced_never_followed(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("private\n")
    rep = tmp_path / "rep"
    rep.mkdir(mode=0o700)
    (rep / "report.csv").symlink_to(victim)
    with OutDir(rep) as d:
        d.write_text("report.csv", "ours\n")
    assert victim.read_text() == "private\n"
    assert not (rep / "report.csv").is_symlink() and (rep / "report.csv").read_text() == "ours\n"


def test_a_directory_that_is_a_link_or_foreign_or_writable_by_others_is_refused(tmp_path):
    target = tmp_path / "elsewhere"
    target.mkdir()
    (tmp_path / "link").symlink_to(target)
    with OutDir(tmp_path / "link"):  # one's own link to one's own directory: as the user meant
        pass
    if os.geteuid() == 0:
        os.chown(tmp_path / "link", 65534, 65534, follow_symlinks=False)
        with pytest.raises(UnsafeDirectory, match="a link of uid 65534"):
            OutDir(tmp_path / "link")
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    with pytest.raises(UnsafeDirectory, match="writable by other users"):
        OutDir(open_dir)
    with pytest.raises(UnsafeDirectory, match="writable by all"):
        OutDir(open_dir / "inside")  # its parent could be swapped
    if os.geteuid() == 0:
        foreign = tmp_path / "foreign"
        foreign.mkdir()
        os.chown(foreign, 65534, 65534)
        with pytest.raises(UnsafeDirectory, match="belongs to uid 65534"):
            OutDir(foreign)
        with pytest.raises(UnsafeDirectory, match="belongs to uid 65534"):
            OutDir(foreign / "report")
    assert list(target.iterdir()) == []


def test_a_sticky_shared_parent_is_fine_for_a_directory_of_ones_own(tmp_path):
    shared = tmp_path / "tmp"
    shared.mkdir()
    shared.chmod(0o1777)
    with OutDir(shared / "mine", fresh=True) as d:
        d.write_text("f", "x")
    with pytest.raises(UnsafeDirectory, match="already exists"):
        OutDir(shared / "mine", fresh=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="gives folders to another uid (chown): root only")
def test_a_folder_another_user_may_rename_in_is_refused_anywhere_above(tmp_path):
    """Issue 56: a sticky folder is safe only when it is root's or the user's (its owner may
    rename anything in it), and so is every folder above, not only the parent."""
    theirs = tmp_path / "theirs"  # another user's /tmp-like folder
    theirs.mkdir()
    os.chown(theirs, 65534, 65534)
    theirs.chmod(0o1777)
    with pytest.raises(UnsafeDirectory, match=f"{theirs} belongs to uid 65534, who may rename"):
        OutDir(theirs / "mine", fresh=True)
    assert list(theirs.iterdir()) == []  # nothing made there
    given = theirs / "given"  # a folder of ours inside it (they may rename it, with all below)
    given.mkdir(mode=0o700)
    with pytest.raises(UnsafeDirectory, match=f"{theirs} belongs to uid 65534"):
        OutDir(given / "runs" / "r1")
    assert list(given.iterdir()) == []
    open_dir = tmp_path / "open"  # writable by all, not sticky, two levels up
    (open_dir / "mine").mkdir(parents=True)
    open_dir.chmod(0o777)
    with pytest.raises(UnsafeDirectory, match=f"{open_dir} is writable by all and not sticky"):
        OutDir(open_dir / "mine" / "runs")
    root_sticky = tmp_path / "tmp"  # root's own sticky folder, as /tmp: fine, at any depth
    (root_sticky / "a").mkdir(parents=True)
    root_sticky.chmod(0o1777)
    with OutDir(root_sticky / "a" / "b" / "runs") as d:
        d.write_text("f", "x")


def test_logs_open_in_the_held_directory_never_through_a_link(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("private\n")
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    (run / "rank0.log").symlink_to(victim)
    with OutDir(run) as d:
        with pytest.raises(OSError):
            d.open_log("rank0.log")
        run.rename(tmp_path / "moved")  # the path now names nothing: the held directory is still it
        with d.open_log("rank1.log") as f:
            f.write(b"ours\n")
    assert victim.read_text() == "private\n"
    assert (tmp_path / "moved" / "rank1.log").read_text() == "ours\n"
    assert stat.S_IMODE((tmp_path / "moved" / "rank1.log").stat().st_mode) == 0o600
