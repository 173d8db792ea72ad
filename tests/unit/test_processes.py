"""The pieces of `down`'s process cleanup that need no root: nsexec's options, the cgroup
path, and the state directory check (tests/kernel/test_processes.py does the real thing)."""

from __future__ import annotations

import os

import pytest

from testbed.common import cgroups, procs, state
from testbed.common.errors import StateError
from testbed.nodes.nsexec import _netns_options


def test_nsexec_takes_cwd_and_cgroup_in_any_order_and_nothing_else():
    assert _netns_options(["t.w0"]) == ("t.w0", None, None)
    assert _netns_options(["t.w0", "--cgroup", "/cg", "--cwd", "/d"]) == ("t.w0", "/d", "/cg")
    for bad in ([], ["--cwd", "/d"], ["t.w0", "--cwd"], ["t.w0", "--cwd", "/a", "--cwd", "/b"],
                ["t.w0", "--mount", "/m"], ["a", "b"]):
        assert _netns_options(bad) is None, bad


def test_the_cgroup_is_named_by_state_directory_and_testbed(monkeypatch, tmp_path):
    info = tmp_path / "mountinfo"
    info.write_text("30 1 0:26 / /sys/fs/cgroup ro - tmpfs tmpfs rw\n"
                    "35 30 0:30 / /sys/fs/cgroup/my\\040unified rw,relatime - cgroup2 cgroup2 rw\n")
    real_open = open
    monkeypatch.setattr("builtins.open", lambda p, *a, **k: real_open(info if p == "/proc/self/mountinfo" else p,
                                                                       *a, **k))
    assert str(cgroups.path_for("db", "0123abcd0123")) == "/sys/fs/cgroup/my unified/testbed/0123abcd0123.db"
    info.write_text("30 1 0:26 / /sys/fs/cgroup rw - cgroup cgroup rw,memory\n")
    assert cgroups.path_for("db", "x") is None and cgroups.create(None) is False


def test_a_process_with_control_characters_in_its_argv_is_described_on_one_line(monkeypatch):
    monkeypatch.setattr(procs, "argv_of", lambda pid: ["python", "-c", "a\nb\x1b[2J"])
    assert procs.describe(os.getpid()).startswith("pid %d (python -c a\\nb\\x1b[2J; state " % os.getpid())


@pytest.mark.skipif(os.geteuid() == 0, reason="root may use any directory")
@pytest.mark.parametrize("mode", [0o500, 0o300, 0o000])
def test_a_state_directory_that_cannot_be_used_is_one_error(monkeypatch, tmp_path, mode):
    d = tmp_path / "state"
    d.mkdir(mode=mode)
    monkeypatch.setenv("TESTBED_STATE_DIR", str(d))
    with pytest.raises(StateError, match="not readable, writable and searchable"):
        state.check_root()


def test_a_state_directory_under_a_file_is_one_error(monkeypatch, tmp_path):
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("TESTBED_STATE_DIR", str(tmp_path / "file" / "state"))
    with pytest.raises(StateError, match="Not a directory|is not a directory") as e:
        state.check_root()
    assert e.value.hint and "TESTBED_STATE_DIR" in e.value.hint
    monkeypatch.setenv("TESTBED_STATE_DIR", str(tmp_path / "new" / "state"))
    assert state.check_root() == tmp_path / "new" / "state"  # made when first needed
